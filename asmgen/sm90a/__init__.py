"""sm90a (Hopper) kernels: CUDA C++ with inline PTX, compiled by nvcc into cubins.

The build driver (asmgen.build) reads KERNELS and calls build() and inspect() for each entry. Every kernel is one
compilation of attention_fwd.cu with its configuration passed as preprocessor definitions; the manifest entry and
the compiler flags come from the same dict, so they cannot disagree.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from ..cuda_tools import nvcc

SOURCE_DIR = Path(__file__).resolve().parent
SOURCES = {"bf16": "attention_fwd.cu", "fp8e4m3": "attention_fwd_fp8.cu"}  # one kernel source per element type

ARCH_FLAGS = ("-gencode", "arch=compute_90a,code=sm_90a")
# -cubin with no debug or line information: the object does not depend on where the tree lives.
COMPILE_FLAGS = ("-cubin", "-O3", "-std=c++17", "-Xptxas", "-warn-spills,-warn-lmem-usage")

TILE_M = 128  # query rows per CTA tile: two consumer warpgroups of 64 rows
TILE_N = 128  # keys per tile
THREADS = 384  # producer warpgroup + two consumer warpgroups
STAGES = 2  # depth of the K/V shared-memory ring
# Q buffers: with two (d = 128 only), the next query tile's Q loads while this one's last key tiles run; measured
# 1-4% slower on the H200 (docs/sm90a.md, "Per-tile overlap and deeper buffers"), a variant
Q_STAGES = 1
BOX_BYTES = 128 * 64 * 2  # one TMA box: 128 rows of 64 BF16 columns (128 bytes, the swizzle width)
SWIZZLE_ALIGN = 1024  # boxes start on the 128-byte swizzle's 1024-byte period; the launch adds that much slack
BARRIER_BYTES = 8

# Ordered kernel parameters; "tmap" = CUtensorMap by value. Strides are in elements. Offsets are added below.
_PARAMS = [
    {"name": "q", "type": "tmap"},
    {"name": "k", "type": "tmap"},
    {"name": "v", "type": "tmap"},
    {"name": "out", "type": "ptr"},
    {"name": "lse", "type": "ptr"},
    {"name": "jobs", "type": "ptr"},
    {"name": "num_jobs", "type": "i32"},
    {"name": "seqlen", "type": "i32"},
    {"name": "heads", "type": "i32"},
    {"name": "heads_k", "type": "i32"},
    {"name": "scale_log2", "type": "f32"},  # softmax_scale * log2(e)
    {"name": "out_stride_b", "type": "i64"},
    {"name": "out_stride_s", "type": "i64"},
    {"name": "out_stride_h", "type": "i64"},
]
ARG_ALIGN = {"tmap": 64, "ptr": 8, "i64": 8, "i32": 4, "u32": 4, "f32": 4}
ARG_SIZE = {"tmap": 128, "ptr": 8, "i64": 8, "i32": 4, "u32": 4, "f32": 4}
# sm_90 kernel parameters live in constant bank 0 from this byte on, and nvcc aligns each parameter's address in
# the bank rather than its offset in the parameter buffer: a tensor map (64-byte aligned) lands at offset 48.
PARAM_BANK_BASE = 0x210


def _with_offsets(params: list[dict]) -> list[dict]:
    out, end = [], 0
    for param in params:
        align = ARG_ALIGN[param["type"]]
        offset = -(-(PARAM_BANK_BASE + end) // align) * align - PARAM_BANK_BASE
        out.append({**param, "offset": offset})
        end = offset + ARG_SIZE[param["type"]]
    return out


ARGS = _with_offsets(_PARAMS)
# FP8: the third tensor map is V^T (batch, heads_k, d_v, keys; keys permuted within each 16, see
# attention_fwd_fp8.cu's pack_p); the descales are device pointers to float32 values per (batch, kv head), read at
# batch * stride_b + head_k * stride_h (element strides: (0, 0) for one value, a broadcast view's own otherwise).
_DESCALES = ("q_descale", "k_descale", "v_descale")
_FP8_PARAMS = [*_PARAMS[:2], {"name": "vt", "type": "tmap"}, *_PARAMS[3:6],
               *({"name": name, "type": "ptr"} for name in _DESCALES),
               *({"name": f"{name}_stride_{dim}", "type": "i32"} for name in _DESCALES for dim in "bh"),
               *_PARAMS[6:]]
FP8_ARGS = _with_offsets(_FP8_PARAMS)


# Shared memory every sm_90 CTA reserves for the system; cuobjdump reports it as the kernel's static shared memory.
RESERVED_SHARED = 1024
MAX_SHARED = 227 * 1024  # the most one CTA may use on sm_90


def dynamic_shared_bytes(d_qk: int, d_v: int, stages: int = STAGES, q_stages: int = Q_STAGES) -> int:
    """Dynamic shared memory of one CTA: `q_stages` Q tiles, `stages` K and V tiles, mbarriers, alignment slack."""
    q_bytes = d_qk // 64 * BOX_BYTES
    v_bytes = d_v // 64 * BOX_BYTES
    barriers = (2 * q_stages + 4 * stages) * BARRIER_BYTES  # per Q slot full/empty; per K/V slot K and V full/empty
    return q_stages * q_bytes + stages * (q_bytes + v_bytes) + barriers + SWIZZLE_ALIGN


# Consumer schedules: "pingpong" (the two consumer warpgroups alternate issuing their GEMMs) measured faster up to
# S = 8K on the H200, "independent" (each issues as soon as its inputs are ready) from S = 16K on (docs/sm90a.md).
SCHEDULES = ("pingpong", "independent")
# The sequence length from which the independent consumers serve (measured crossover, docs/sm90a.md): the
# entries' seqlen_min / seqlen_max, which dispatch reads.
INDEPENDENT_FROM_SEQLEN = 4096


def _seqlen_range(schedule: str) -> dict:
    if schedule == "pingpong":
        return {"seqlen_min": None, "seqlen_max": INDEPENDENT_FROM_SEQLEN}
    return {"seqlen_min": INDEPENDENT_FROM_SEQLEN, "seqlen_max": None}


def _kernel(d_qk: int, d_v: int, tau: float, schedule: str) -> dict:
    dims = f"d{d_qk}" if d_qk == d_v else f"d{d_qk}_{d_v}"
    name = f"sm90a_fwd_bf16_{dims}_{schedule}"
    return {
        "name": name,
        "symbol": f"zyfa_{name}",
        "file": f"{name}.cubin",
        "dtype": "bf16",
        "d_qk": d_qk,
        "d_v": d_v,
        "p_mode": "bf16",
        "p_mode_default": True,
        "p_shift": 0,
        "rowsum": "fp32",
        "tile_m": TILE_M,
        "tile_n": TILE_N,
        "scale_block": None,
        "rescale_threshold": tau,
        "threads": THREADS,
        "shared_bytes": dynamic_shared_bytes(d_qk, d_v) + RESERVED_SHARED,  # all the CTA needs: static + dynamic
        "grid": "persistent",
        "stages": STAGES,
        "q_stages": Q_STAGES,
        "schedule": schedule,
        **_seqlen_range(schedule),
        "offset_bits": 64,
        "masks_tail": True,
        "args": ARGS,
    }


# ---- FP8 (e4m3): attention_fwd_fp8.cu --------------------------------------------------------------------------

FP8_BOX_COLS = 128  # e4m3 columns per TMA box: 128 bytes, the 128-byte swizzle's width
FP8_ONES_ROWS = 8  # rows of e4m3 ones after each V^T tile: the P V product's N = d_v + 8 gives the row sums
# Depth of the K/V^T ring per p_mode: a third slot measured +1-4% for exact P at d = 128 and +3-9% at d_qk = 192 from
# S = 4K (none at 32K), and 0-6% slower for lean P from 8K (docs/sm90a.md, "Lean P and the exponential wall").
FP8_STAGES = {"exact": 3, "lean": 2}


# How the FP8 kernels' row sum l adds a tile's probabilities (ZYFA_ROWSUM): "ones" the ones columns of the P V
# product (rowsum "rounded", but in the tensor core's truncating accumulator), "fp32" the unrounded FP32 p (rowsum
# "fp32", FA3's way), "f16" the rounded P from the packed fragments, summed in f16x2 then FP32 (rowsum "rounded").
FP8_ROWSUM_METHODS = {"ones": (0, "rounded"), "fp32": (1, "fp32"), "f16": (2, "rounded")}
# Measured on the H200 (docs/sm90a.md, "FP8"): "ones" loses the small probabilities of a tile whose P spans more than
# the accumulator's 13 bits (an attention sink): 1.4-2.7x the model's error on activation-like inputs; "fp32" is
# back at FA3's error on Gaussian inputs (1.15x ours); "f16" matches the model within 2% on all of them.
FP8_ROWSUM_METHOD = "f16"


def fp8_dynamic_shared_bytes(d_qk: int, d_v: int, stages: int, ones: bool = True) -> int:
    """Q (boxes of 128 columns: d_qk = 192 takes two, the second half zeros), `stages` K and V^T (+ ones) tiles,
    mbarriers, alignment slack."""
    qk_bytes = -(-d_qk // FP8_BOX_COLS) * TILE_M * FP8_BOX_COLS
    vt_bytes = (d_v + FP8_ONES_ROWS * ones) * TILE_N
    return qk_bytes + stages * (qk_bytes + vt_bytes) + (2 + 4 * stages) * BARRIER_BYTES + SWIZZLE_ALIGN


# FP8 consumers issue independently at every length: the ping-pong form does not fit its registers (S 64, the
# block accumulator 68, O 64, P 16 per thread; ptxas spills), see docs/sm90a.md.
FP8_SCHEDULES = ("independent",)


# FP8 p_modes: "exact" (the default) and "lean" (the API's p_mode="lean").
FP8_P_MODES = ("exact", "lean")
FP8_DEFAULT_P_MODE = "exact"


def _fp8_kernel(d_qk: int, d_v: int, schedule: str, p_mode: str, rowsum_method: str = FP8_ROWSUM_METHOD) -> dict:
    stages = FP8_STAGES[p_mode]
    dims = f"d{d_qk}" if d_qk == d_v else f"d{d_qk}_{d_v}"
    name = f"sm90a_fwd_fp8_{dims}_{'lean_' if p_mode == 'lean' else ''}{schedule}"
    return {
        "name": name,
        "symbol": f"zyfa_{name}",
        "file": f"{name}.cubin",
        "dtype": "fp8e4m3",
        "d_qk": d_qk,
        "d_v": d_v,
        "p_mode": p_mode,
        "p_mode_default": p_mode == FP8_DEFAULT_P_MODE,
        "p_shift": 8,
        "rowsum": FP8_ROWSUM_METHODS[rowsum_method][1],
        "rowsum_method": rowsum_method,
        "tile_m": TILE_M,
        "tile_n": TILE_N,
        "scale_block": None,
        "rescale_threshold": 0.125,
        "threads": THREADS,
        "shared_bytes": fp8_dynamic_shared_bytes(d_qk, d_v, stages, rowsum_method == "ones") + RESERVED_SHARED,
        "grid": "persistent",
        "stages": stages,
        "schedule": schedule,
        "seqlen_min": None,  # the one schedule serves every length
        "seqlen_max": None,
        "offset_bits": 64,
        "masks_tail": True,
        "v_transposed": True,  # the third tensor map is V^T with keys permuted within each 16 (host pre-pass)
        "args": FP8_ARGS,
    }


BF16_KERNELS: list[dict] = [_kernel(d_qk, d_v, tau, schedule)
                            for d_qk, d_v, tau in ((128, 128, 0.5), (192, 128, 8.0)) for schedule in SCHEDULES]
FP8_KERNELS: list[dict] = [_fp8_kernel(d_qk, 128, schedule, p_mode) for p_mode in FP8_P_MODES for d_qk in (128, 192)
                           for schedule in FP8_SCHEDULES]
KERNELS: list[dict] = BF16_KERNELS + FP8_KERNELS


def fp8_defines(kernel: dict) -> list[str]:
    """Preprocessor configuration of one FP8 kernel."""
    return [
        f"-DZYFA_KERNEL={kernel['symbol']}",
        f"-DZYFA_D_QK={kernel['d_qk']}",
        f"-DZYFA_D_V={kernel['d_v']}",
        f"-DZYFA_STAGES={kernel['stages']}",
        f"-DZYFA_DYNAMIC_SHARED_BYTES={kernel['shared_bytes'] - RESERVED_SHARED}",
        f"-DZYFA_PINGPONG={int(kernel['schedule'] == 'pingpong')}",
        f"-DZYFA_ROWSUM={FP8_ROWSUM_METHODS[kernel['rowsum_method']][0]}",
        f"-DZYFA_LEAN={int(kernel['p_mode'] == 'lean')}",
    ]


# Of the 16 groups of four scores a consumer thread holds per key tile, how many take their exponentials from the
# FMA-pipe polynomial instead of ex2 (MUFU) in the shipped kernels: none, since every fraction measured slower
# (docs/sm90a.md, "Exponentials on the FMA pipe"); benchmarks/sm90a_variants.py builds the others.
POLY_EXP2_GROUPS = 0

# Schedules whose kernels tie the softmax to a barrier arrive ahead of the P V wait, so that ptxas keeps it under
# the running P V (ZYFA_PIN_SOFTMAX in attention_fwd.cu), and advance wgmma descriptors from a tile's base by one
# add (ZYFA_DESC_ADD). Measured on the H200 (docs/sm90a.md): +0-4% for the independent consumers at S = 8K-32K,
# d = 128; in ping-pong, where the other consumer's GEMMs already cover the softmax, -1% to +3% there and -5% to -8%
# at 2K.
PINNED_SCHEDULES = ("independent",)
# Which mbarrier waits sleep until a barrier changes instead of polling (ZYFA_WAIT_HINT): 0 none (the shipped
# kernels), 1 the producer's, 2 every wait. The polling producer takes issue slots from its SM sub-partition's
# consumer warps, but sleeping measured neutral on the H200 (-3% to +2%, docs/sm90a.md, "Profile").
WAIT_HINT = 0
# Whether a query tile's last P V and the CTA's next tile's first QK^T are issued together (ZYFA_CROSS_TILE), so that
# the per-tile fill and drain overlap: off in the shipped kernels, measured no faster (-10% to +2%, docs/sm90a.md).
CROSS_TILE = False
# Whether P fragments are double-buffered so their BF16 packing runs ahead of the P V wait (ZYFA_DOUBLE_P): off in
# the shipped kernels (measured no faster than pinning alone); a variant of benchmarks/sm90a_variants.py.
DOUBLE_P = False
# Kernels (d_qk, schedule) whose tile row maxima skip their quad reductions when a warp vote finds no partial maximum
# above m + tau (ZYFA_VOTE_MAX; the results are bitwise the same). Measured on the H200 (docs/sm90a.md, "Voting on
# the row maxima"), means of three runs for the d = 128 independent kernel: +1-3% from S = 16K, +1% at 8K, -1% to
# -2% at 4K; at d_qk = 192 -3% to +1% from 8K, and at 2K -3% to -5%.
VOTE_MAX_KERNELS = {(128, "independent")}
# Whether the steady-state steps start the exponentials before the tile's row maxima are known, recomputing S when
# a maximum moves (ZYFA_SPECULATE; bitwise the same results): off in the shipped kernels, measured -3.5% to +1%
# (docs/sm90a.md); a variant of benchmarks/sm90a_variants.py.
SPECULATE = False


def defines(kernel: dict, *, overlap: bool = True, pingpong: bool | None = None, fma_scale: bool = True,
            poly_exp2_groups: int = POLY_EXP2_GROUPS, pin_softmax: bool | None = None,
            double_p: bool = DOUBLE_P, desc_add: bool | None = None, wait_hint: int = WAIT_HINT,
            cross_tile: bool = CROSS_TILE, vote_max: bool | None = None, speculate: bool = SPECULATE,
            leave_out: int = 0) -> list[str]:
    """Preprocessor configuration of one kernel; the keywords give the variants the benchmark compares (pingpong,
    pin_softmax, desc_add and vote_max default to the kernel's head dim and schedule; leave_out > 0 only for timing:
    results are wrong)."""
    if pingpong is None:
        pingpong = kernel["schedule"] == "pingpong"
    pinned = kernel["schedule"] in PINNED_SCHEDULES
    pin_softmax = pinned if pin_softmax is None else pin_softmax
    desc_add = pinned if desc_add is None else desc_add
    if vote_max is None:
        vote_max = (kernel["d_qk"], kernel["schedule"]) in VOTE_MAX_KERNELS
    return [
        f"-DZYFA_KERNEL={kernel['symbol']}",
        f"-DZYFA_D_QK={kernel['d_qk']}",
        f"-DZYFA_D_V={kernel['d_v']}",
        f"-DZYFA_TAU={float(kernel['rescale_threshold'])!r}f",
        f"-DZYFA_STAGES={kernel['stages']}",
        f"-DZYFA_Q_STAGES={kernel['q_stages']}",
        f"-DZYFA_DYNAMIC_SHARED_BYTES={kernel['shared_bytes'] - RESERVED_SHARED}",
        f"-DZYFA_OVERLAP={int(overlap)}",
        f"-DZYFA_PINGPONG={int(pingpong)}",
        f"-DZYFA_FMA_SCALE={int(fma_scale)}",
        f"-DZYFA_POLY_EXP2_GROUPS={int(poly_exp2_groups)}",
        f"-DZYFA_PIN_SOFTMAX={int(pin_softmax)}",
        f"-DZYFA_DOUBLE_P={int(double_p)}",
        f"-DZYFA_DESC_ADD={int(desc_add)}",
        f"-DZYFA_WAIT_HINT={int(wait_hint)}",
        f"-DZYFA_CROSS_TILE={int(cross_tile)}",
        f"-DZYFA_VOTE_MAX={int(vote_max)}",
        f"-DZYFA_SPECULATE={int(speculate)}",
        f"-DZYFA_LEAVE_OUT={int(leave_out)}",
    ]


def build(kernel: dict, path: Path, **variant) -> None:
    """Compile `kernel` into a cubin at `path`. nvcc runs in a temporary folder on a copy of the sources, so the
    object does not depend on the checkout's location."""
    with tempfile.TemporaryDirectory() as tmp:
        for src in SOURCE_DIR.glob("*.cu*"):
            shutil.copy(src, Path(tmp) / src.name)
        source = SOURCES[kernel["dtype"]]
        config = fp8_defines(kernel, **variant) if kernel["dtype"] == "fp8e4m3" else defines(kernel, **variant)
        cmd = [nvcc(), *ARCH_FLAGS, *COMPILE_FLAGS, *config, "-o", "kernel.cubin", source]
        result = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True)
        if result.returncode != 0 or ("warning" in result.stderr.lower() and not os.environ.get("ZYFA_ALLOW_SPILLS")):
            raise RuntimeError(f"nvcc failed for {kernel['name']}:\n{result.stderr}")
        Path(path).write_bytes((Path(tmp) / "kernel.cubin").read_bytes())


def cuobjdump() -> str:
    """cuobjdump from PATH or from the nvidia-cuda-cuobjdump wheel."""
    found = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump")
    if found:
        return found
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(root) / "cu13" / "bin" / "cuobjdump"
        if candidate.exists():
            return str(candidate)
    raise RuntimeError("inspecting sm90a cubins needs cuobjdump: install the nvidia-cuda-cuobjdump package "
                       "or put cuobjdump on PATH (or in env CUOBJDUMP)")


_FUNCTION = re.compile(r"Function (\S+):\s*\n\s*(.*)")
_PARAM_INFO = re.compile(r"Ordinal\s*:\s*(0x[0-9a-f]+)\s+Offset\s*:\s*(0x[0-9a-f]+)\s+Size\s*:\s*(0x[0-9a-f]+)")


def _run_cuobjdump(*args: str) -> str:
    result = subprocess.run([cuobjdump(), *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"cuobjdump {' '.join(args)} failed:\n{result.stderr}")
    return result.stdout


def param_layout(path: Path) -> list[tuple[int, int]]:
    """(offset, size) of each kernel parameter in order, from the cubin's EIATTR_KPARAM_INFO records."""
    found = {int(o, 16): (int(off, 16), int(size, 16)) for o, off, size in _PARAM_INFO.findall(
        _run_cuobjdump("-elf", str(path)))}
    return [found[i] for i in sorted(found)]


def inspect(kernel: dict, path: Path) -> dict:
    """Symbols and resources (registers, static shared memory, stack, local memory) from cuobjdump; fails when the
    parameter offsets the cubin declares differ from the kernel's args."""
    declared = param_layout(path)
    expected = [(a["offset"], ARG_SIZE[a["type"]]) for a in kernel["args"]]
    if declared != expected:
        raise RuntimeError(f"{kernel['name']}: parameter (offset, size) in the cubin {declared} != args {expected}")
    symbols, resources = [], {}
    for name, fields in _FUNCTION.findall(_run_cuobjdump("--dump-resource-usage", str(path))):
        symbols.append(name)
        if name == kernel["symbol"]:
            values = dict(item.split(":", 1) for item in fields.split())
            resources = {
                "registers": int(values["REG"]),
                "stack_bytes": int(values["STACK"]),
                "static_shared_bytes": int(values["SHARED"]),
                "local_bytes": int(values["LOCAL"]),
            }
    if resources.get("static_shared_bytes") != RESERVED_SHARED:
        raise RuntimeError(f"{kernel['name']}: static shared memory {resources.get('static_shared_bytes')} is not the "
                           f"{RESERVED_SHARED} bytes shared_bytes assumes")
    return {"symbols": symbols, "resources": resources}
