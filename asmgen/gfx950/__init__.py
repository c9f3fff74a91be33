"""gfx950 (MI355X) FP8 attention kernels: generated assembly, assembled with LLVM into code objects.

The build driver (asmgen.build) uses KERNELS, build(kernel, path) and inspect(kernel, path); the simulator's tests
use generate(kernel_name, faults) and assemble(text) to run deliberately broken variants.
"""

from __future__ import annotations

from pathlib import Path

from . import toolchain
from .kernel import (
    ARG_SIZE,
    ARGS,
    FAULTS,
    PERSISTENT_GRID,
    SCALE_BLOCK,
    TAU,
    TILE_M,
    TILE_N,
    WAVE_SIZE,
    WAVES,
    KernelGen,
    Variant,
)

VARIANTS = {v.name: v for v in (Variant("fp8_d128", 128, 128, "lean"), Variant("fp8_d192", 192, 128, "exact"))}


def _entry(v: Variant) -> dict:
    return {
        "name": v.name, "symbol": v.symbol, "file": f"{v.name}.co", "dtype": "fp8e4m3", "d_qk": v.d_qk,
        "d_v": v.d_v, "p_mode": v.p_mode, "tile_m": TILE_M, "tile_n": TILE_N, "scale_block": SCALE_BLOCK,
        "rescale_threshold": TAU, "threads": WAVES * WAVE_SIZE, "shared_bytes": v.lds_bytes, "grid": "persistent",
        "grid_size": PERSISTENT_GRID,
        "p_mode_default": True,  # each head dim has one kernel: lean at d = 128, exact at d_qk = 192
        "p_shift": 8, "rowsum": "rounded", "schedule": "chiplet_pairs", "seqlen_min": None, "seqlen_max": None,
        "offset_bits": 32,  # buffer offsets per (batch, head) slice
        "masks_tail": False,  # seqlen is padded to the tiles
        "args": [{"name": n, "type": t} for n, t in ARGS],
    }


KERNELS: list[dict] = [_entry(v) for v in VARIANTS.values()]


def _variant(name: str) -> Variant:
    if name not in VARIANTS:
        raise KeyError(f"kernel_name: unknown gfx950 kernel {name!r}; known are {sorted(VARIANTS)}")
    return VARIANTS[name]


def generate(kernel_name: str, faults: frozenset[str] = frozenset()) -> str:
    """Assembly text of a kernel; `faults` injects the named defects (see kernel.FAULTS) for simulator tests."""
    return KernelGen(_variant(kernel_name), frozenset(faults)).generate()


def register_table(kernel_name: str):
    return KernelGen(_variant(kernel_name), frozenset()).r


def assemble(text: str) -> bytes:
    """Code object bytes of assembly text (clang-22 for gfx950, linked by ld.lld-22)."""
    return toolchain.assemble(text)


def build(kernel: dict, path: Path) -> None:
    Path(path).write_bytes(assemble(generate(kernel["name"])))


def inspect(kernel: dict, path: Path) -> dict:
    return toolchain.inspect(Path(path))


__all__ = ["ARG_SIZE", "FAULTS", "KERNELS", "VARIANTS", "assemble", "build", "generate", "inspect",
           "register_table"]
