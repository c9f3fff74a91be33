"""The HIP kernels' manifest entries and compile flags: one source per family, one code object per configuration."""

from __future__ import annotations

import re
from pathlib import Path

SOURCE_DIR = Path(__file__).resolve().parent
TILE_M = 256  # query rows per workgroup tile: 8 waves of 32
TILE_N = 64  # keys per tile (the model's key_tile)
THREADS = 512
PERSISTENT_GRID = 256  # one workgroup per CU of an MI355X; the job table is chiplet-ordered for this grid
SOURCES = {"bf16": "attention_bf16.hip", "fp8e4m3": "attention_fp8.hip"}  # one source file per dtype
FP8_TAU = 0.125
FP8_P_SHIFT = 8  # P is written 2^8 larger before its e4m3 rounding
BF16_SLOTS = 2  # K / V^T tiles in LDS (the ping-pong writes one while it reads the other)
BF16_TAU = {128: 0.5, 192: 8.0}  # the contract's lazy-rescale thresholds per d_qk
# The BF16 key-loop schedules (attention_bf16.hip): at d = 128 the ping-pong keeps two score tiles in flight (the
# next tile's QK^T issued before the current tile's softmax); d_qk = 192 has no registers for a second score tile.
BF16_SCHEDULE = {128: "pingpong_two_tiles", 192: "stages8"}
SCHEDULE_DEFINES = {"pingpong_two_tiles": "ZYFA_TWO_TILES", "stages8": "ZYFA_STAGES"}

# Fixed flags: device code only, no HIP runtime or device library, no FMA contraction (the model's FP32 steps are
# separate roundings), no SDWA forms (the simulator does not model sub-dword addressing), no per-compile unique id
# (a rebuild is byte for byte the committed object), and the scheduler's own register-pressure trackers (with the
# default ones the d_qk = 192 ping-pong spills 2 VGPRs; with these it takes 254).
FLAGS = ["-x", "hip", "--cuda-device-only", "--offload-arch=gfx950", "-nogpulib", "-nogpuinc", "-O3",
         "--no-gpu-bundle-output", "-mcode-object-version=5", "-ffp-contract=off", "-mllvm",
         "-amdgpu-sdwa-peephole=false", "-fuse-cuid=none", "-mllvm", "-amdgpu-use-amdgpu-trackers=1",
         f"-I{SOURCE_DIR}"]


def _args(stride: str) -> list[dict]:
    """The argument buffer (the kernels' Params struct): the assembly kernels' layout; strides in elements."""
    names = [("q", "ptr"), ("k", "ptr"), ("v", "ptr"), ("out", "ptr"), ("lse", "ptr"), ("q_descale", "ptr"),
             ("k_descale", "ptr"), ("v_descale", "ptr"), ("jobs", "ptr"), ("num_jobs", "i32"), ("seqlen", "i32"),
             ("heads", "i32"), ("heads_k", "i32"), ("softmax_scale", "f32")]
    names += [(f"{t}_stride_{a}", stride) for t in ("q", "k", "v", "out") for a in ("b", "s", "h")]
    return [{"name": n, "type": t} for n, t in names]


def _bf16(d_qk: int, d_v: int) -> dict:
    name = f"bf16_d{d_qk}"
    return {
        "name": name, "symbol": f"zyfa_gfx950_{name}", "file": f"{name}.co", "source": "hip", "dtype": "bf16",
        "d_qk": d_qk, "d_v": d_v,
        "p_mode": "bf16", "p_mode_default": True, "p_shift": 0, "rescale_threshold": BF16_TAU[d_qk],
        "scale_block": None, "rowsum": "fp32", "tile_m": TILE_M, "tile_n": TILE_N, "schedule": BF16_SCHEDULE[d_qk],
        "seqlen_min": None, "seqlen_max": None, "offset_bits": 32, "masks_tail": False, "threads": THREADS,
        "shared_bytes": BF16_SLOTS * _bf16_lds(d_qk, d_v), "grid": "persistent", "grid_size": PERSISTENT_GRID,
        "args": _args("i32"),
    }


def _bf16_lds(d_qk: int, d_v: int) -> int:
    """One slot: K tile (rows padded by 8 elements) and V^T tile (rows padded by 4), BF16: attention_bf16.hip's Lds."""
    return 2 * (TILE_N * (d_qk + 8) + d_v * (TILE_N + 4))


def _fp8_wide(d_qk: int, d_v: int, p_mode: str) -> dict:
    name = f"fp8_d{d_qk}_wide"
    return {
        "name": name, "symbol": f"zyfa_gfx950_{name}", "file": f"{name}.co", "source": "hip", "dtype": "fp8e4m3",
        "d_qk": d_qk, "d_v": d_v,
        "p_mode": p_mode, "p_mode_default": True, "p_shift": FP8_P_SHIFT, "rescale_threshold": FP8_TAU,
        "scale_block": TILE_N, "rowsum": "rounded", "tile_m": TILE_M, "tile_n": TILE_N, "schedule": "lockstep",
        "seqlen_min": None, "seqlen_max": None, "offset_bits": 64, "masks_tail": False, "threads": THREADS,
        "shared_bytes": TILE_N * (d_qk + 16) + d_v * (TILE_N + 16), "grid": "persistent",
        "grid_size": PERSISTENT_GRID, "args": _args("i64"),
    }


# The FP8 kernels with 64-bit offsets share (dtype, d_qk, d_v, p_mode) with the assembly kernels: the dispatch takes
# them only for tensors whose (batch, head) slices span more than the assembly kernels' 32-bit offsets address.
WIDE_FP8: list[dict] = [_fp8_wide(128, 128, "lean"), _fp8_wide(192, 128, "exact")]
KERNELS: list[dict] = [_bf16(128, 128), _bf16(192, 128), *WIDE_FP8]
_BY_NAME = {k["name"]: k for k in KERNELS}


def kernel_entry(name: str) -> dict:
    if name not in _BY_NAME:
        raise KeyError(f"kernel_name: unknown HIP kernel {name!r}; known are {sorted(_BY_NAME)}")
    return _BY_NAME[name]


def compile_flags(kernel: dict) -> list[str]:
    defines = {"ZYFA_SYMBOL": kernel["symbol"], "ZYFA_D_QK": kernel["d_qk"], "ZYFA_D_V": kernel["d_v"],
               "ZYFA_TAU": f"{kernel['rescale_threshold']}f"}
    flags = FLAGS + [f"-D{k}={v}" for k, v in defines.items()]
    if kernel["dtype"] == "fp8e4m3":
        flags.append(f"-DZYFA_P_SHIFT={kernel['p_shift']}")
    if kernel["p_mode"] == "lean":
        flags.append("-DZYFA_LEAN")
    if kernel["schedule"] in SCHEDULE_DEFINES:
        flags.append(f"-D{SCHEDULE_DEFINES[kernel['schedule']]}")
    if kernel["offset_bits"] == 64:
        flags.append("-DZYFA_OFFSET64")
    return flags


# Faults for the simulator's tests: each drops every line of the assembly it matches.
_WAITCNT_VM = re.compile(r"^\s*s_waitcnt\b.*vmcnt")
_BARRIER = re.compile(r"^\s*s_barrier\b")
FAULTS = {
    "drop_waitcnt": lambda line: bool(_WAITCNT_VM.match(line)),  # global loads used before they land
    "drop_barrier": lambda line: bool(_BARRIER.match(line)),  # LDS tiles read before every wave wrote its share
}
