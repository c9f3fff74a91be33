"""Test support: a fake CUDA / HIP driver library that records every call (see fake_driver.c)."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

FAKE_DRIVER_SOURCE = Path(__file__).resolve().parent / "fake_driver.c"
FAKE_DRIVER_NAME = "libzyfa_fake_driver.so"


def build_fake_driver(directory: str | Path) -> Path:
    """Compile the fake driver with the system C compiler (`cc`) into `directory`; returns the library's path.

    Point ZYFA_CUDA_DRIVER and ZYFA_HIP_DRIVER at it before the first launch, and ZYFA_FAKE_DRIVER_LOG at a file
    to receive one JSON line per driver call."""
    compiler = shutil.which("cc")
    if compiler is None:
        raise RuntimeError("building the fake driver needs a C compiler on PATH as `cc`")
    output = Path(directory) / FAKE_DRIVER_NAME
    output.parent.mkdir(parents=True, exist_ok=True)
    command = [compiler, "-std=c11", "-D_GNU_SOURCE", "-O1", "-Wall", "-shared", "-fPIC",
               "-o", str(output), str(FAKE_DRIVER_SOURCE), "-lpthread"]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"building the fake driver failed ({' '.join(command)}):\n{result.stderr}")
    return output


def read_fake_driver_log(path: str | Path) -> list[dict]:
    """The calls recorded so far, oldest first (an empty list if none were)."""
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def fake_image(symbols: str, params: str | None = None) -> bytes:
    """A code object the fake driver accepts: `symbols` the comma-separated functions it holds, `params` the
    "offset:size,..." parameter layout its cuFuncGetParamInfo reports (the kernel then takes no parameters)."""
    text = f"ZYFA-FAKE symbols={symbols}" + (f" params={params}" if params else "")
    return text.encode()


def write_manifest(directory: str | Path, kernels: list[tuple[dict, bytes]], version: str | None = None) -> Path:
    """Write a test-only manifest.json and its code objects under `directory`; returns the manifest's path.

    `kernels` pairs each manifest entry (its "file" relative to `directory`) with the object's bytes; the
    entry's sha256 is filled in from them."""
    from . import __version__

    directory = Path(directory)
    entries = []
    for entry, image in kernels:
        path = directory / entry["file"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(image)
        entries.append({**entry, "sha256": hashlib.sha256(image).hexdigest()})
    path = directory / "manifest.json"
    path.write_text(json.dumps({"version": version or __version__, "kernels": entries}, indent=1))
    return path
