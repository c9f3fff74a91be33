"""The FP8 V^T pre-pass kernel (transpose_v.cu): its manifest entry and its build and inspect steps.

The FP8 attention kernels read V as V^T (batch, heads_k, d_v, keys) with keys permuted within each 16 (see
transpose_v.cu); this kernel writes it in one pass over V, from V in any strides whose head dim is contiguous. Its
entry has a kind of its own ("transpose_v"): dispatch and the support matrix read only attention entries
(zyfa_kernels' Manifest.kernels), and asmgen.build builds it from this module's KERNELS, build and inspect
(asmgen.build.KIND_MODULES).
"""

from __future__ import annotations

from pathlib import Path

from . import RESERVED_SHARED, _with_offsets, compile_cubin
from . import inspect as inspect_cubin

SOURCE = Path(__file__).resolve().parent / "transpose_v.cu"
KIND = "transpose_v"
TILE_KEYS = 128  # keys per CTA: a 16 KiB shared tile of 128 keys by 128 dims
KEY_GROUP = 16  # keys permuted within groups of 16 (the FP8 kernels' P operand order)
THREADS = 256  # eight warps, each storing 4 dim quads of the tile's 8 key groups (transpose_v.cu)

_PARAMS = [
    {"name": "v", "type": "ptr"},
    {"name": "vt", "type": "ptr"},
    {"name": "seqlen", "type": "i32"},
    {"name": "keys", "type": "i32"},  # seqlen rounded up to KEY_GROUP: V^T's row length
    {"name": "v_stride_b", "type": "i64"},  # element (= byte) strides of V as (batch, seqlen, heads_k, d_v)
    {"name": "v_stride_s", "type": "i64"},
    {"name": "v_stride_h", "type": "i64"},
]


def _kernel(d_v: int) -> dict:

    name = f"sm90a_transpose_v_fp8_d{d_v}"
    return {
        "kind": KIND,
        "name": name,
        "symbol": f"zyfa_{name}",
        "file": f"{name}.cubin",
        "dtype": "fp8e4m3",
        "d_v": d_v,
        "tile_keys": TILE_KEYS,
        "key_group": KEY_GROUP,
        "threads": THREADS,
        "shared_bytes": TILE_KEYS * d_v + RESERVED_SHARED,  # the static tile, no dynamic shared memory
        "args": _with_offsets(_PARAMS),
    }


KERNELS: list[dict] = [_kernel(128)]


def build(kernel: dict, path: Path) -> None:
    """Compile transpose_v.cu for `kernel` into a cubin at `path`."""
    defines = (f"-DZYFA_KERNEL={kernel['symbol']}", f"-DZYFA_D_V={kernel['d_v']}",
               f"-DZYFA_TILE_KEYS={kernel['tile_keys']}", f"-DZYFA_THREADS={kernel['threads']}")
    compile_cubin(kernel["name"], {SOURCE.name: SOURCE.read_text()}, SOURCE.name, path, defines)


def inspect(kernel: dict, path: Path) -> dict:
    """Symbols and resources from cuobjdump (asmgen.sm90a.inspect); the kernel's shared memory is all static."""
    return inspect_cubin(kernel, path, static_shared=kernel["shared_bytes"])
