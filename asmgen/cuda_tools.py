"""The CUDA compiler of the sm90a build: nvcc 13.0.88 from PyPI, so that a machine with Python alone builds the cubins.

The pinned wheels (REQUIREMENTS: nvcc with ptxas, and what nvcc runs: cicc from nvvm, the crt and runtime headers)
give cubins byte-identical to a CUDA 13.0 toolkit install's, which `python -m asmgen.build --check` verifies against
the manifest's sha256. nvcc() looks in this order: env NVCC, the nvidia-cuda-nvcc wheel of this interpreter's
environment, nvcc on PATH; whichever it finds must report the pinned release, since another release compiles
different bytes. nvcc still needs a host C++ compiler (g++ or clang++) to preprocess the sources.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

NVCC_RELEASE = "13.0.88"
REQUIREMENTS = (
    f"nvidia-cuda-nvcc=={NVCC_RELEASE}",
    f"nvidia-nvvm=={NVCC_RELEASE}",
    f"nvidia-cuda-crt=={NVCC_RELEASE}",
    "nvidia-cuda-runtime==13.0.96",  # math_constants.h; the runtime release that ships with nvcc 13.0.88
)
WHEEL_BIN = Path("cu13") / "bin"  # inside the `nvidia` namespace package the wheels install into


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
    found = os.environ.get("NVCC") or wheel_tool("nvcc") or shutil.which("nvcc")
    if not found:
        raise RuntimeError(f"the sm90a build needs nvcc {NVCC_RELEASE}: pip install {' '.join(REQUIREMENTS)} "
                           f"(or put it on PATH, or in env NVCC)")
    version = subprocess.run([str(found), "--version"], capture_output=True, text=True).stdout
    if f"V{NVCC_RELEASE}" not in version:
        last = version.strip().splitlines()[-2:] or ["no version output"]
        raise RuntimeError(f"{found} is not nvcc {NVCC_RELEASE} ({' / '.join(last)}): other releases compile other "
                           f"bytes than the manifest records; pip install {' '.join(REQUIREMENTS)}")
    return str(found)
