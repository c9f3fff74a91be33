"""gfx950 (MI355X) attention kernels in HIP C++, compiled by clang-22 for gfx950 (device code only, no HIP runtime
headers: zyfa_hip.h declares what the kernels use) into code objects of target gfx950.

The gfx950 target module (asmgen.gfx950) lists KERNELS among its own and builds entries whose `source` is "hip"
through build(kernel, path) here; inspect is the gfx950 toolchain's (metadata note and kernel descriptor).
generate(name, faults) gives a kernel's assembly (clang -S) with the named defects injected, for the simulator's
tests; assemble(text) turns it back into a code object.
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

from .kernels import FAULTS, KERNELS, SOURCE_DIR, SOURCES, WIDE_FP8, compile_flags, kernel_entry

CLANG = "clang-22"


def _compile(kernel: dict, out: Path, *extra: str) -> None:
    src = SOURCE_DIR / SOURCES[kernel["dtype"]]
    run = subprocess.run([CLANG, *compile_flags(kernel), *extra, str(src), "-o", str(out)], capture_output=True,
                         text=True)
    if run.returncode != 0:
        raise RuntimeError(f"{CLANG} failed to compile {src.name} for {kernel['name']}:\n{run.stderr}")


def build(kernel: dict, path: Path) -> None:
    """Compile the kernel's HIP source into a gfx950 code object at `path`."""
    _compile(kernel, Path(path), "-c")


def code_object(kernel_name: str) -> bytes:
    """A fresh build of the kernel from its source."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "kernel.co"
        build(kernel_entry(kernel_name), out)
        return out.read_bytes()


def inspect(kernel: dict, path: Path) -> dict:
    from asmgen.gfx950 import toolchain
    return toolchain.inspect(Path(path))


def generate(kernel_name: str, faults: frozenset[str] = frozenset()) -> str:
    """The kernel's assembly as clang emits it, with `faults` (see kernels.FAULTS) injected."""
    unknown = set(faults) - set(FAULTS)
    if unknown:
        raise ValueError(f"faults: unknown {sorted(unknown)}; known are {sorted(FAULTS)}")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "kernel.s"
        _compile(kernel_entry(kernel_name), out, "-S")
        lines = out.read_text().splitlines(keepends=True)
    for fault in sorted(faults):
        drop = FAULTS[fault]
        kept = [line for line in lines if not drop(line)]
        if len(kept) == len(lines):
            raise RuntimeError(f"{kernel_name}: fault {fault} matches no instruction")
        lines = kept
    return "".join(lines)


def assemble(text: str) -> bytes:
    from asmgen.gfx950 import toolchain
    return toolchain.assemble(text)


__all__ = ["CLANG", "FAULTS", "KERNELS", "WIDE_FP8", "assemble", "build", "code_object", "generate", "inspect",
           "kernel_entry"]
