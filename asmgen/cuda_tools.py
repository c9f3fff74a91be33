"""The CUDA compiler of the sm90a build: nvcc from PyPI, so that a machine with Python alone builds the cubins.

The wheels pinned in asmgen/build-requirements.txt (nvcc with ptxas, and what nvcc runs: cicc from nvvm, the crt
and runtime headers) compile cubins byte-identical to a CUDA 13.0 toolkit install's, which
`python -m asmgen.build --check` verifies against the manifest's sha256. nvcc() looks in this order: env NVCC, the
nvidia-cuda-nvcc wheel of this interpreter's environment, nvcc on PATH; whichever it finds must report the pinned
release, since another release compiles other bytes. nvcc still needs a host C++ compiler (g++ or clang++) to
preprocess the sources.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

REQUIREMENTS = Path(__file__).resolve().parent / "build-requirements.txt"
INSTALL = "pip install -r asmgen/build-requirements.txt"
WHEEL_BIN = Path("cu13") / "bin"  # inside the `nvidia` namespace package the wheels install into


def pinned_release(requirements: Path = REQUIREMENTS) -> str:
    """The nvcc release the requirements pin (the line nvidia-cuda-nvcc==X)."""
    for line in requirements.read_text().splitlines():
        name, _, release = line.partition("==")
        if name.strip() == "nvidia-cuda-nvcc":
            return release.strip()
    raise RuntimeError(f"{requirements} pins no nvidia-cuda-nvcc release")


def wheel_tool(name: str) -> Path | None:
    """`name` from the nvidia-* wheels of this environment (nvidia/cu13/bin/<name>), or None."""
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(root) / WHEEL_BIN / name
        if candidate.is_file():
            return candidate
    return None


@functools.cache
def nvcc() -> str:
    """Path of nvcc (see the module docstring for the order); RuntimeError naming the fix when none fits."""
    release = pinned_release()
    found = os.environ.get("NVCC") or wheel_tool("nvcc") or shutil.which("nvcc")
    if not found:
        raise RuntimeError(f"the sm90a build needs nvcc {release}: {INSTALL} (or put it on PATH, or in env NVCC)")
    version = subprocess.run([str(found), "--version"], capture_output=True, text=True).stdout
    if f"V{release}" not in version:
        last = version.strip().splitlines()[-2:] or ["no version output"]
        raise RuntimeError(f"{found} is not nvcc {release} ({' / '.join(last)}): other releases compile other bytes "
                           f"than the manifest records; {INSTALL}")
    return str(found)
