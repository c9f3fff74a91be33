"""Sessions: tests, lint, wheels, demo (CPU machines) and asm, cubin, objects-check, sim, accuracy, bench.

    nox -s tests           CPU test suite (every package, the code-object check, the simulator runs)
    nox -s demo            attention on this machine: a short benchmark on a supported GPU, else the CPU reference
    nox -s lint            ruff
    nox -s wheels          build the three wheels into dist/
    nox -s asm             regenerate the gfx950 code objects and their manifest entries
    nox -s cubin           rebuild the sm90a cubins and their manifest entries
    nox -s objects-check   committed code objects and manifest equal a fresh build
    nox -s sim             run the committed gfx950 objects in the ISA simulator
    nox -s accuracy        the accuracy table of the numerics (docs/accuracy.md)
    nox -s bench           the GPU validation and benchmark run (needs an H100/H200)
"""

from __future__ import annotations

import shutil

import nox

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["lint", "tests"]

TORCH_CPU = "torch==2.13.0"  # the CPU build on machines without a GPU
PACKAGES = ("packages/zyfa-kernels", "packages/zyfa-torch", "packages/zyfa-tools")
LLVM = ("clang-22", "ld.lld-22", "llvm-mc-22", "llvm-objdump-22", "llvm-readelf-22")
BUILD_TOOLS = ("nvidia-cuda-cuobjdump", "nvidia-cuda-nvdisasm", "tinygrad==0.14.0")  # nvdisasm: cuobjdump --dump-sass


def _has_gpu() -> bool:
    return shutil.which("nvidia-smi") is not None or shutil.which("rocm-smi") is not None


def _ensure_llvm(session: nox.Session) -> None:
    """LLVM 22 assembles the gfx950 objects; Debian packages it (a clean machine lacks it)."""
    if all(shutil.which(tool) for tool in LLVM):
        return
    session.run("apt-get", "update", "-qq", external=True)
    session.run("apt-get", "install", "-y", "-qq", "clang-22", "lld-22", "llvm-22", external=True)


def _install(session: nox.Session, *extra: str) -> None:
    if not _has_gpu():
        session.install(TORCH_CPU)
    session.install(*PACKAGES, *extra)


@nox.session
def tests(session: nox.Session) -> None:
    """The CPU test suite: every package, objects equal a fresh build, simulated gfx950 kernels."""
    _ensure_llvm(session)
    _install(session, "pytest", "hypothesis", "numpy", "matplotlib", *BUILD_TOOLS)
    session.run("python", "-m", "asmgen.build", "--check")
    session.run("python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "packages", "asmgen", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", ".")


@nox.session
def wheels(session: nox.Session) -> None:
    """Build the three wheels (zyfa-kernels carries the code objects and the loader extension)."""
    session.install("build")
    for package in PACKAGES:
        session.run("python", "-m", "build", "--wheel", "--outdir", "dist", package)


@nox.session
def demo(session: nox.Session) -> None:
    """Attention on this machine: a short benchmark on a supported GPU, else the reference path on the CPU."""
    _install(session)
    session.run("python", "-m", "zyfa_tools.demo", *session.posargs)


@nox.session
def asm(session: nox.Session) -> None:
    _ensure_llvm(session)
    _install(session, *BUILD_TOOLS)
    session.run("python", "-m", "asmgen.build", "--target", "gfx950")


@nox.session
def cubin(session: nox.Session) -> None:
    _install(session, *BUILD_TOOLS)
    session.run("python", "-m", "asmgen.build", "--target", "sm90a")


@nox.session(name="objects-check")
def objects_check(session: nox.Session) -> None:
    _ensure_llvm(session)
    _install(session, *BUILD_TOOLS)
    session.run("python", "-m", "asmgen.build", "--check")


@nox.session
def sim(session: nox.Session) -> None:
    _ensure_llvm(session)
    _install(session, *BUILD_TOOLS)
    args = session.posargs or ["run", "--kernel", "fp8_d128", "--seqlen", "512", "--heads", "4", "--kv-heads", "1"]
    session.run("python", "-m", "asmgen.sim", *args)


@nox.session
def accuracy(session: nox.Session) -> None:
    _install(session, "matplotlib")
    session.run("python", "-m", "zyfa_tools.accuracy", *session.posargs)


@nox.session
def bench(session: nox.Session) -> None:
    session.run("bash", "ci/gpu.sh", *session.posargs, external=True)
