"""ZYFA: causal FlashAttention for LLM prefill (BF16 or FP8 e4m3 inputs, BF16 output) behind the flash-attn API.

CPU tensors run the reference backend (the numerics model); GPU tensors run the prebuilt kernels of the
zyfa-kernels package, which is loaded only when a GPU backend is used.
"""

from __future__ import annotations

from importlib import metadata

from . import numerics
from ._version import __version__
from .interface import flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func, flash_attn_varlen_func
from .quant import fp8_quantize

__all__ = [
    "__version__",
    "flash_attn_func",
    "flash_attn_kvpacked_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_varlen_func",
    "fp8_quantize",
    "numerics",
]

KERNELS_DISTRIBUTION = "zyfa-kernels"


def _require_matching_kernels() -> None:
    """Refuse an installed zyfa-kernels of another version (read from its metadata: importing it loads the
    native loader, which the CPU path never needs)."""
    try:
        installed = metadata.version(KERNELS_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return
    if installed != __version__:
        raise ImportError(
            f"zyfa {__version__} needs zyfa-kernels {__version__}, but zyfa-kernels {installed} is installed: "
            f"install matching versions, e.g. pip install zyfa-kernels=={__version__}"
        )


_require_matching_kernels()
