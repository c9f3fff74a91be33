"""The FP8 V^T pre-pass kernel (transpose_v.cu): its manifest entry and its build and inspect steps.

The FP8 attention kernels read V as V^T (batch, heads_k, d_v, keys) with keys permuted within each 16 (see
transpose_v.cu); this kernel writes it in one pass over V, from V in any strides whose head dim is contiguous. Its
entry has a kind of its own ("transpose_v"): dispatch and the support matrix read only attention entries
(zyfa_kernels' Manifest.kernels), and asmgen.build builds it from this module's KERNELS, build and inspect
(asmgen.build.KIND_MODULES).
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

from ..cuda_tools import nvcc

SOURCE = Path(__file__).resolve().parent / "transpose_v.cu"
KIND = "transpose_v"
TILE_KEYS = 128  # keys per CTA: a 16 KiB shared tile of 128 keys by 128 dims
KEY_GROUP = 16  # keys permuted within groups of 16 (the FP8 kernels' P operand order)
RESERVED_SHARED = 1024  # shared memory every sm_90 CTA reserves; cuobjdump counts it as static

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
    from . import _with_offsets  # the parameter offsets nvcc gives sm_90 kernels

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
        "threads": TILE_KEYS // KEY_GROUP * 32,
        "shared_bytes": TILE_KEYS * d_v + RESERVED_SHARED,  # the static tile, no dynamic shared memory
        "args": _with_offsets(_PARAMS),
    }


KERNELS: list[dict] = [_kernel(128)]


def build(kernel: dict, path: Path) -> None:
    """Compile transpose_v.cu for `kernel` into a cubin at `path` (in a temporary folder: location-independent)."""
    from . import ARCH_FLAGS, COMPILE_FLAGS

    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / SOURCE.name).write_bytes(SOURCE.read_bytes())
        config = [f"-DZYFA_KERNEL={kernel['symbol']}", f"-DZYFA_D_V={kernel['d_v']}",
                  f"-DZYFA_TILE_KEYS={kernel['tile_keys']}"]
        cmd = [nvcc(), *ARCH_FLAGS, *COMPILE_FLAGS, *config, "-o", "kernel.cubin", SOURCE.name]
        result = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True)
        if result.returncode != 0 or "warning" in result.stderr.lower():
            raise RuntimeError(f"nvcc failed for {kernel['name']}:\n{result.stderr}")
        Path(path).write_bytes((Path(tmp) / "kernel.cubin").read_bytes())


def inspect(kernel: dict, path: Path) -> dict:
    """Symbols and resources from cuobjdump; fails when the cubin's parameter offsets differ from the entry's args
    or its static shared memory from shared_bytes."""
    from . import _FUNCTION, ARG_SIZE, _run_cuobjdump, param_layout

    declared = param_layout(path)
    expected = [(a["offset"], ARG_SIZE[a["type"]]) for a in kernel["args"]]
    if declared != expected:
        raise RuntimeError(f"{kernel['name']}: parameter (offset, size) in the cubin {declared} != args {expected}")
    symbols, resources = [], {}
    for name, fields in _FUNCTION.findall(_run_cuobjdump("--dump-resource-usage", str(path))):
        symbols.append(name)
        if name == kernel["symbol"]:
            values = dict(item.split(":", 1) for item in fields.split())
            resources = {"registers": int(values["REG"]), "stack_bytes": int(values["STACK"]),
                         "static_shared_bytes": int(values["SHARED"]), "local_bytes": int(values["LOCAL"])}
    if resources.get("static_shared_bytes") != kernel["shared_bytes"]:
        raise RuntimeError(f"{kernel['name']}: static shared memory {resources.get('static_shared_bytes')} is not "
                           f"the {kernel['shared_bytes']} bytes of shared_bytes")
    return {"symbols": symbols, "resources": resources}
