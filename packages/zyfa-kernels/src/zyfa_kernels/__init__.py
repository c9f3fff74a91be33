"""ZYFA's prebuilt attention code objects, their manifest, and a driver-level loader.

    kernel = zyfa_kernels.manifest().find("sm90a", dtype="bf16", d_qk=128)
    zyfa_kernels.launch(kernel, device=0, grid=(132, 1, 1), stream=stream, args={...})

Importing this package needs no GPU and no driver, and loads no native code: the extension behind `launch`,
`launcher`, `device_info` and `encode_tensor_map` is imported on their first use, and the driver library it opens
on its first call. The manifest is plain Python and JSON, so the CPU path reads it without either.
"""

from __future__ import annotations

from importlib import metadata

__version__ = metadata.version("zyfa-kernels")  # written once, in the repository's VERSION file

from .args import ArgLayout
from .errors import DriverError, DriverUnavailable, KernelNotFound, ManifestError
from .manifest import Kernel, Manifest, manifest

_LOADER_NAMES = ("device_info", "encode_tensor_map", "launch", "launcher", "Launcher")


def __getattr__(name: str):
    if name in _LOADER_NAMES:
        from . import loader

        return getattr(loader, name)
    raise AttributeError(f"module 'zyfa_kernels' has no attribute {name!r}")


def pack_args(kernel: Kernel, values: dict) -> bytes:
    """The argument buffer `launch` passes for `kernel`: ints for ptr/i32/u32/i64, floats for f32, the 128 bytes
    of encode_tensor_map for tmap. Missing or unexpected names raise ValueError naming them."""
    return kernel.layout.pack(values, kernel.name)


__all__ = [
    "ArgLayout", "DriverError", "DriverUnavailable", "Kernel", "KernelNotFound", "Launcher", "Manifest",
    "ManifestError", "__version__", "device_info", "encode_tensor_map", "launch", "launcher", "manifest",
    "pack_args",
]
