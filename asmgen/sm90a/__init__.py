"""sm90a (Hopper) kernels: CUDA C++ with inline PTX, compiled by nvcc into cubins.

The build driver (asmgen.build) reads KERNELS and calls build() and inspect() for each entry. A kernel is one
compilation of its element type's entry point (attention_fwd.cu, attention_fwd_fp8.cu): the pieces of the kernel
family (config.cuh lists them) instantiated with the zyfa::Config that config_header() writes from the kernel's
manifest entry. The entry and the compiled configuration come from the same dict, so they cannot disagree.
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
STAGES = 2  # depth of the K/V shared-memory ring (one Q buffer: a second measured 1-4% slower, docs/sm90a.md)
BOX_ROW_BYTES = 128  # a TMA box's row: the 128-byte swizzle's width (64 BF16 or 128 e4m3 columns)
SWIZZLE_ALIGN = 1024  # boxes start on the 128-byte swizzle's 1024-byte period; the launch adds that much slack
BARRIER_BYTES = 8
# The epilogue's shared memory per query row of the tile, by store form (pipeline.cuh): a 128-byte row of one pass of
# 64 columns (staged), or the whole 256-byte row pitched 272 bytes apart (bulk)
STAGING_ROW_BYTES = {"direct": 0, "staged": BOX_ROW_BYTES, "bulk": 272}

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
# softmax_fp8.cuh's pack_p); the descales are device pointers to float32 values per (batch, kv head), read at
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


# How each kernel's epilogue stores O (config.cuh, Store; epilogue.cuh): "staged" (each warp's rows through shared
# memory, 16-byte stores of whole 128-byte rows), "bulk" (whole rows through shared memory by bulk copies, which the
# TMA engine stores while the warp goes on) or "direct" (4-byte stores from the accumulator). Measured on the H200
# (docs/sm90a.md, "The staged epilogue, the in-kernel V^T and sleeping waits"), staged over direct: BF16 +1% to +14% at
# 2K, 0 to +11% at 4K, -2% to +2% from 8K; exact P +4% to +10% at 2K, +1% to +4% at 8K, -1% to +2% at 32K; lean P -2%
# to -5% from 8K. Bulk ("The epilogue by bulk copies"): over direct for lean P +2% to +7% at 1000-8K (d = 128) and +4%
# / +4% at 2K / 8K (d_qk = 192); over staged -4% to +3% (BF16 d = 128, exact P), so those stay staged.
STORES = {("fp8e4m3", "lean"): "bulk"}


def epilogue_store(dtype: str, p_mode: str) -> str:
    return STORES.get((dtype, p_mode), "staged")


def shared_bytes(kernel: dict, store: str | None = None) -> int:
    """A kernel's shared_bytes (static + dynamic) from its manifest fields, the layout of pipeline.cuh: a Q tile of
    128 rows in boxes of 128 bytes (d_qk = 192 in e4m3 takes two, the second half zeros), `stages` K and V tiles
    (FP8: V^T), the epilogue's rows (`store`: if not the measured choice, a measurement variant's), mbarriers
    (Q full/empty; per K/V slot K and V full/empty), alignment slack, and the system's reservation."""
    element_bytes = 2 if kernel["dtype"] == "bf16" else 1
    q_bytes = -(-kernel["d_qk"] * element_bytes // BOX_ROW_BYTES) * TILE_M * BOX_ROW_BYTES
    v_bytes = kernel["d_v"] * element_bytes * TILE_N
    staging = TILE_M * STAGING_ROW_BYTES[store or epilogue_store(kernel["dtype"], kernel["p_mode"])]
    stages = kernel["stages"]
    return (q_bytes + stages * (q_bytes + v_bytes) + staging + (2 + 4 * stages) * BARRIER_BYTES + SWIZZLE_ALIGN
            + RESERVED_SHARED)


# Consumer schedules: "pingpong" (the two consumer warpgroups alternate issuing their GEMMs) and "independent" (each
# issues as soon as its inputs are ready).
SCHEDULES = ("pingpong", "independent")
# The BF16 kernels of each d_qk in order of S: (schedule, with the moved-maximum test (kCodeTest), the S from which it
# serves); each serves up to the next one's first S (the entries' seqlen_min / seqlen_max, which dispatch reads).
# Measured on the H200 (docs/sm90a.md): d = 128, ping-pong 2-6% ahead of the independent kernel at S = 1000 and
# 2-4% behind from 2K; the code-test kernel with the ring probe (PROBE_RING_CODE_TEST_D_QK) over the independent one
# in three runs -2.5% to +6.9% at 2K (mean +2.8%), 0 to +5% at 3000, +4% to +10% at 4K ("The epilogue under the next
# QK^T and the d = 128 ranges"), so no d = 128 independent BF16 kernel is built; level with ping-pong at 1000 until
# its moved-maximum test took the halves' maximum, +1.7% / +2.6% over it there since ("The moved-maximum test by
# maxima"). d_qk = 192: ping-pong ahead at 1000 (+0.7% / +4.4%); the code-test kernel +1.4% to +6.9% over the
# independent one at 4K in three runs ("The hand-off and the BF16 ranges"), with the maxima +1.7% to +12% over
# ping-pong at 2K-3000 in three runs, and with the per-tile choices +3% and +6.5% over it at 1536, +2% at 1792, -4% to
# +4% at 768-1280 ("The first pair on a second machine"), so from 1536.
BF16_SERVES_FROM = {
    128: (("pingpong", False, 0), ("pingpong", True, 1000)),
    192: (("pingpong", False, 0), ("pingpong", True, 1536)),
}


def _seqlen_range(d_qk: int, schedule: str, code_test: bool) -> dict:
    kernels = BF16_SERVES_FROM[d_qk]
    i = [kernel[:2] for kernel in kernels].index((schedule, code_test))
    return {"seqlen_min": kernels[i][2] or None, "seqlen_max": kernels[i + 1][2] if i + 1 < len(kernels) else None}


def _entry(dtype: str, d_qk: int, d_v: int, schedule: str, variant: str = "", **fields) -> dict:
    """The manifest entry of one kernel: what every sm90a kernel shares, then the element type's `fields`, then
    the shared memory all of it needs."""
    dims = f"d{d_qk}" if d_qk == d_v else f"d{d_qk}_{d_v}"
    name = f"sm90a_fwd_{'bf16' if dtype == 'bf16' else 'fp8'}_{dims}_{variant}{schedule}"
    entry = {
        "name": name,
        "symbol": f"zyfa_{name}",
        "file": f"{name}.cubin",
        "dtype": dtype,
        "d_qk": d_qk,
        "d_v": d_v,
        "tile_m": TILE_M,
        "tile_n": TILE_N,
        "scale_block": None,
        "threads": THREADS,
        "grid": "persistent",
        "schedule": schedule,
        "offset_bits": 64,
        "masks_tail": True,
        **fields,
    }
    return {**entry, "shared_bytes": shared_bytes(entry)}


def _bf16_kernel(d_qk: int, d_v: int, tau: float, schedule: str, code_test: bool = False) -> dict:
    return _entry(
        "bf16", d_qk, d_v, schedule, "code_test_" if code_test else "",
        p_mode="bf16",
        p_mode_default=True,
        p_shift=0,
        rowsum="fp32",
        rescale_threshold=tau,
        stages=STAGES,
        code_test=code_test,
        **_seqlen_range(d_qk, schedule, code_test),
        args=ARGS,
    )


# ---- FP8 (e4m3): attention_fwd_fp8.cu --------------------------------------------------------------------------

# Depth of the K/V^T ring per p_mode: a third slot measured 0 to +4% for exact P at d = 128 (none at 32K) and +2% to
# +9% at d_qk = 192 from 4K, and -11% to +1% for lean P (docs/sm90a.md, "Lean P and the exponential wall").
FP8_STAGES = {"exact": 3, "lean": 2}


# The FP8 kernels' row sum adds the rounded P from the packed fragments, in f16x2 then FP32 (rowsum "rounded"). Measured
# on the H200 (docs/sm90a.md, "FP8") and deleted: the ones columns of an N = 136 P V product lose the small
# probabilities of a tile whose P spans more than the accumulator's 13 bits (1.4-2.7x the model's error on sink-heavy
# inputs); the unrounded FP32 p (FA3's way) is back at FA3's error on Gaussian inputs (1.15x ours).


# The FP8 consumers' schedule per p_mode, one for every length. Measured on the H200 (docs/sm90a.md, "Probing the
# ring"), ping-pong over independent: lean P +1% to +7% at 2K-8K and 0 to +2% from 16K (+2% to +8% with the probe
# both have); exact P -5% to +1%, with the probe -6% to +1%.
FP8_SCHEDULE = {"exact": "independent", "lean": "pingpong"}


# FP8 p_modes whose key tiles after the first write P against the maximum as it stands and find the row maxima only
# when the codes show one may have moved (kCodeTest, softmax_fp8.cuh; the results are bitwise the same). Measured on
# the H200 in two runs (docs/sm90a.md, "The moved-maximum test on the codes") against the same kernels without it:
# exact P +1% to +10% (d = 128 +1% to +7%), lean P +2% to +13%, but for d_qk = 192 at 2K MHA in one run (-2%, -3%).
CODE_TEST_P_MODES = {"exact", "lean"}


# FP8 p_modes: "exact" (the default) and "lean" (the API's p_mode="lean").
FP8_P_MODES = ("exact", "lean")
FP8_DEFAULT_P_MODE = "exact"


def _fp8_kernel(d_qk: int, d_v: int, schedule: str, p_mode: str) -> dict:
    stages = FP8_STAGES[p_mode]
    return _entry(
        "fp8e4m3", d_qk, d_v, schedule, "lean_" if p_mode == "lean" else "",
        p_mode=p_mode,
        p_mode_default=p_mode == FP8_DEFAULT_P_MODE,
        p_shift=8,
        rowsum="rounded",
        rescale_threshold=0.125,
        stages=stages,
        code_test=p_mode in CODE_TEST_P_MODES,
        seqlen_min=None,  # the one schedule serves every length
        seqlen_max=None,
        v_transposed=True,  # the third tensor map is V^T with keys permuted within each 16 (host pre-pass)
        args=FP8_ARGS,
    )


BF16_KERNELS: list[dict] = [_bf16_kernel(d_qk, d_v, tau, schedule, code_test)
                            for d_qk, d_v, tau in ((128, 128, 0.5), (192, 128, 8.0))
                            for schedule, code_test, _ in BF16_SERVES_FROM[d_qk]]
FP8_KERNELS: list[dict] = [_fp8_kernel(d_qk, 128, FP8_SCHEDULE[p_mode], p_mode) for p_mode in FP8_P_MODES
                           for d_qk in (128, 192)]
KERNELS: list[dict] = BF16_KERNELS + FP8_KERNELS


# Element types whose consumers probe the next step's K and V under the softmax (kProbeRing, pipeline.cuh). Measured
# on the H200 (docs/sm90a.md, "Probing the ring") against the same kernels without it: FP8 exact P in two runs
# d = 128 -4% to +4% (mean +1%), d_qk = 192 -1% to +9% (mean +3%), its wait for K and V 146 -> 71 cycles per key tile
# (8K); lean P ping-pong -2% to +4% (above +1% in 13 of 20 cells). BF16: -8% to +7% by schedule and length, not taken.
PROBE_RING_DTYPES = {"fp8e4m3"}
# ... and the BF16 code-test kernels of these d_qk: over the same kernel without it, in two runs ("The tensor pipe's
# ceiling"), d = 128 +0.5% to +9% (one cell -0.3%), d_qk = 192 -4.4% to +2.4%.
PROBE_RING_CODE_TEST_D_QK = {128}


def probes_ring(kernel: dict) -> bool:
    """Whether a kernel's consumers probe the next step's K and V under the softmax (kProbeRing)."""
    return kernel["dtype"] in PROBE_RING_DTYPES or (
        kernel["dtype"] == "bf16" and kernel["code_test"] and kernel["d_qk"] in PROBE_RING_CODE_TEST_D_QK)


# The per-tile choices of the BF16 kernels, measured on the H200 (docs/sm90a.md, "The per-tile patches and the late
# turn, measured" and "The first pair on a second machine"): every BF16 kernel finishes a query tile's rows under its
# last P V (kLeanEpilogue: the lse by lg2.approx, so all kernels of a head dims keep bitwise the same lse); the
# code-test kernels load a query tile's first K ahead of its Q (kKFirst) and shorten a query tile's edges each in its
# own way: d_qk = 192 one loop with the diagonal step masked by a flag (kCompactTail: +2.7% and +2.3% on average at
# 1000-4K on two machines, level from 8K), d = 128 a query tile's first two QK^T in one turn (kFirstPair: +2.0% and
# +1.3% on average at 1000-8K on two machines; the d_qk = 192 kernel spills with it, and the compact tail made the
# d = 128 step 4-7% longer).
CODE_TEST_EDGE = {128: "first_pair", 192: "compact_tail"}


_SCHEDULE_TYPES = {"pingpong": "PingPong", "independent": "Independent"}
_STORE_TYPES = {"direct": "Store::kDirect", "staged": "Store::kStaged", "bulk": "Store::kBulk"}


def _cxx_bool(value: bool) -> str:
    return "true" if value else "false"


def config_header(kernel: dict, *, store: str | None = None, probe_ring: bool | None = None,
                  code_test: bool | None = None, tile_edges: bool = True) -> str:
    """kernel_config.cuh of one kernel: its symbol and zyfa::Config (config.cuh), from its manifest entry and the
    measured choices above. The keywords are choices a measurement variant makes differently
    (asmgen/sm90a/experiments; default: STORES, probes_ring, the entry's code_test and the per-tile choices)."""
    code_test = kernel["code_test"] if code_test is None else code_test
    fields = [
        ("int", "kDQk", kernel["d_qk"]),
        ("int", "kDV", kernel["d_v"]),
        ("int", "kStages", kernel["stages"]),
        ("float", "kTau", f"{float(kernel['rescale_threshold'])!r}f"),
        ("Store", "kStore", _STORE_TYPES[store or epilogue_store(kernel["dtype"], kernel["p_mode"])]),
        ("bool", "kProbeRing", _cxx_bool(probes_ring(kernel) if probe_ring is None else probe_ring)),
        ("bool", "kCodeTest", _cxx_bool(code_test)),
    ]
    if kernel["dtype"] == "bf16":
        element = "Bf16"
        edge = CODE_TEST_EDGE[kernel["d_qk"]] if tile_edges and code_test else None
        fields += [("bool", "kLeanEpilogue", _cxx_bool(tile_edges)), ("bool", "kKFirst", _cxx_bool(edge is not None)),
                   ("bool", "kCompactTail", _cxx_bool(edge == "compact_tail")),
                   ("bool", "kFirstPair", _cxx_bool(edge == "first_pair"))]
    else:
        element = "E4m3"
        fields += [
            ("PMode", "kPMode", "PMode::kLean" if kernel["p_mode"] == "lean" else "PMode::kExact"),
        ]
    fields.append(("int", "kDynamicSharedBytes", kernel["shared_bytes"] - RESERVED_SHARED))
    lines = [f"// {kernel['name']}: written by asmgen.sm90a.config_header from its manifest entry",
             "#pragma once", "", '#include "config.cuh"', "", f"#define ZYFA_KERNEL {kernel['symbol']}", "",
             "namespace zyfa {", f"struct Config : {element} {{",
             *(f"  static constexpr {t} {name} = {value};" for t, name, value in fields),
             f"  using Schedule = {_SCHEDULE_TYPES[kernel['schedule']]};", "};", "}  // namespace zyfa", ""]
    return "\n".join(lines)


def build(kernel: dict, path: Path, **variant) -> None:
    """Compile `kernel` into a cubin at `path` (`variant`: config_header's keywords); fails where ptxas serialised
    its wgmmas (sass.serialised). nvcc runs in a temporary folder on a copy of the sources and the generated config,
    so the object does not depend on the checkout's location."""
    from .sass import instructions, serialised  # sass imports this module

    files = {src.name: src.read_text() for src in SOURCE_DIR.glob("*.cu*")}
    files["kernel_config.cuh"] = config_header(kernel, **variant)
    compile_cubin(kernel["name"], files, SOURCES[kernel["dtype"]], path)
    if serialised(instructions(path)):
        Path(path).unlink()
        raise RuntimeError(f"ptxas serialised the wgmmas of {kernel['name']} (each waited for before the next)")


def compile_cubin(name: str, files: dict[str, str], source: str, path: Path, defines: tuple[str, ...] = ()) -> None:
    """nvcc `source` (one of `files`, name -> text, written to a temporary folder so that the object does not depend
    on the checkout's location) with the sm_90a flags and `defines` into a cubin at `path`; a warning (a spill) fails
    unless env ZYFA_ALLOW_SPILLS is set."""
    with tempfile.TemporaryDirectory() as tmp:
        for file, text in files.items():
            (Path(tmp) / file).write_text(text)
        cmd = [nvcc(), *ARCH_FLAGS, *COMPILE_FLAGS, *defines, "-o", "kernel.cubin", source]
        result = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True)
        if result.returncode != 0 or ("warning" in result.stderr.lower() and not os.environ.get("ZYFA_ALLOW_SPILLS")):
            raise RuntimeError(f"nvcc failed for {name}:\n{result.stderr}")
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


def inspect(kernel: dict, path: Path, static_shared: int = RESERVED_SHARED) -> dict:
    """Symbols and resources (registers, static shared memory, stack, local memory) from cuobjdump; fails when the
    parameter offsets the cubin declares differ from the kernel's args, or its static shared memory from
    `static_shared` (what the entry's shared_bytes assumes: the system's reservation for dynamic-memory kernels)."""
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
    if resources.get("static_shared_bytes") != static_shared:
        raise RuntimeError(f"{kernel['name']}: static shared memory {resources.get('static_shared_bytes')} is not the "
                           f"{static_shared} bytes shared_bytes assumes")
    return {"symbols": symbols, "resources": resources}
