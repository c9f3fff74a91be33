"""Microbenchmarks on an H100/H200: the pipes the FP8 softmax's instructions use, its step on registers, and the
tensor pipe's ceiling under the attention kernels' GEMMs.

    python -m asmgen.sm90a.experiments.microbench build DIR   # here: nvcc, and each loop's SASS checked
    python -m asmgen.sm90a.experiments.microbench run DIR     # on the GPU: the tables, markdown on stdout

pipes.cu: one kernel per instruction type (or pair), eight independent chains in a loop; cycles per loop iteration
and SM sub-partition at 1, 2 and 4 warps per sub-partition, and at 4 the cycles per instruction (for a pair: the
sum of its two rates means the two share a pipe, their maximum that they do not). softmax_alone.cu: the FP8
consumer's exact-P softmax step (softmax_fp8.cuh) in a loop without the kernel around it, whole, as lean P or
without one part, and the BF16 kernels' step, at 1 and 2 warps per sub-partition (the cycles per step that a
sub-partition completes), and both steps beside another warpgroup's QK^T-shaped wgmmas: waited for group by group
(gemm), kept in the tensor pipe's queue (queued), or issued faster than the pipe takes them, so that its warps stall
in the issue as a ping-pong consumer's do while its partner's GEMMs run (blocked). gemm_ceiling.cu: the
key-tile step's GEMMs alone (QK^T from shared memory and P V from registers, d = 128, e4m3 and BF16, two
warpgroups per SM, random operands; `_split`: the QK^T as two GEMMs of 64 keys), timed for long enough that the
clock settles: the TFLOP/s and SM clock the kernels' own GEMMs sustain, beside torch's GEMMs of 8192^3 (BF16, and
e4m3 with and without fast accumulation). code_fetch.cu: loops of 4 KB to 256 KB of straight-line code at 1, 2 and 4
warps per sub-partition, the cycles per instruction as a function of the code's size (the instruction caches' sizes
and the rate at which each level beyond them feeds the scheduler).
The build checks that each
loop holds the instructions it claims (KERNELS), so that a number measures what its name says. The driver is called
through ctypes (libcuda), the buffers come from torch; progress to stderr.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import sys
from pathlib import Path

from .. import SOURCE_DIR, compile_cubin, sass

HERE = Path(__file__).parent
ITERATIONS = {"pipes": 4096, "softmax_alone": 256, "gemm_ceiling": 131072}
FETCH_KB = (4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)  # code_fetch.cu's loop bodies
FETCH_INSTRUCTIONS = 1 << 20  # per warp and kernel: a loop of K KB runs 2^20 / (64 K) times
SASS_BYTES = 16  # one sm_90a instruction
GEMM_SHARED_BYTES = 32768  # softmax_beside_*: a 64 x 128 and a 128 x 128 e4m3 tile, 1024-byte aligned
WGMMA_CYCLES = 64  # one m64n128k32 e4m3 wgmma: 64 * 128 * 32 FMA at 4096 per cycle and SM
# softmax_beside_*: how the second warpgroup issues (softmax_alone.cu's Issue) -> wgmmas per commit group
BESIDE = {"idle": 0, "gemm": 4, "queued": 4, "blocked": 16}
SUBPARTITIONS = 4
CEILING_SHARED_BYTES = 96 * 1024 + 1024  # gemm_ceiling.cu's operands, 1024-byte aligned
CEILING_STEP_FLOP = 2 * (2 * 64 * 128 * 128)  # per warpgroup and step: QK^T and P V, 64 x 128 x 128 MACs each
GEMM_SIZE = 8192  # torch's GEMMs beside the ceiling kernels

# Per kernel: the instructions of one loop iteration that it measures (SASS opcode prefix -> count). The build
# checks them; the pipe kernels' cycles per instruction come from them. The softmax's are the shipped step's.
_STEP = {"MUFU.EX2": 66, "FMNMX": 74, "F2FP.SATFINITE.E4M3": 32, "F2FP.F16.E4M3.UNPACK_B": 32}
_BF16_STEP = {"MUFU.EX2": 66, "FMNMX": 74, "F2FP.BF16.F32.PACK_AB": 32}
KERNELS = {
    "pipes": {
        "pipe_ex2": {"MUFU.EX2": 8},
        "pipe_ffma": {"FFMA": 8},
        "pipe_fadd": {"FADD": 8},
        "pipe_fmul": {"FMUL": 8},
        "pipe_fmnmx": {"FMNMX": 8},
        "pipe_hmnmx2": {"HMNMX2": 8},
        "pipe_lop3": {"LOP3": 8},
        "pipe_iadd3": {"IADD3": 8},
        "pipe_imad": {"IMAD": 8},
        "pipe_hadd2": {"HADD2": 4, "HFMA2.MMA": 4},
        "pipe_prmt": {"PRMT": 8},
        "pipe_shf": {"SHF": 8},
        "pipe_pack_e4m3": {"F2FP.SATFINITE.E4M3": 16, "PRMT": 8},
        "pipe_unpack_e4m3": {"F2FP.F16.E4M3.UNPACK_B": 8},
        "pipe_pack_bf16": {"F2FP.BF16.F32.PACK_AB": 8},
        "pipe_ex2_and_pack_e4m3": {"MUFU.EX2": 4, "F2FP.SATFINITE.E4M3": 8, "PRMT": 4},
        "pipe_ex2_and_unpack_e4m3": {"MUFU.EX2": 4, "F2FP.F16.E4M3.UNPACK_B": 4},
        "pipe_ex2_and_pack_bf16": {"MUFU.EX2": 4, "F2FP.BF16.F32.PACK_AB": 4},
        "pipe_ex2_and_fmnmx": {"MUFU.EX2": 4, "FMNMX": 4},
        "pipe_fmnmx_and_ffma": {"FMNMX": 4, "FFMA": 4},
        "pipe_fmnmx_and_hmnmx2": {"FMNMX": 4, "HMNMX2": 4},
        "pipe_pack_and_unpack_e4m3": {"F2FP.SATFINITE.E4M3": 8, "F2FP.F16.E4M3.UNPACK_B": 4, "PRMT": 4},
    },
    "softmax_alone": {
        "softmax_all": _STEP,
        "softmax_lean_p": {"MUFU.EX2": 2, "FMNMX": 74, "FFMA.SAT": 64, "PRMT": 48, "F2FP.F16.E4M3.UNPACK_B": 32},
        "softmax_no_row_sums": {**_STEP, "F2FP.F16.E4M3.UNPACK_B": 0},
        "softmax_no_row_maxima": {**_STEP, "MUFU.EX2": 64, "FMNMX": 0},
        "softmax_no_add_tile": _STEP,
        "softmax_bf16": _BF16_STEP,
        **{f"softmax_beside_{issue}": _STEP for issue in BESIDE},
        **{f"softmax_bf16_beside_{issue}": _BF16_STEP for issue in BESIDE},
    },
    "gemm_ceiling": {
        "ceiling_fp8": {"QGMMA": 8, "HGMMA": 0},
        "ceiling_bf16": {"HGMMA": 16},
        "ceiling_fp8_split": {"QGMMA": 12, "HGMMA": 0},
        "ceiling_bf16_split": {"HGMMA": 24},
    },
    "code_fetch": {f"fetch_{kb}kb": {"FFMA": kb * 1024 // SASS_BYTES // 2, "IADD3": kb * 1024 // SASS_BYTES // 2}
                   for kb in FETCH_KB},
}


def build(folder: Path) -> list[Path]:
    """The cubins in `folder`, compiled like the kernels (spills fail), each loop checked against KERNELS."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {src.name: src.read_text() for where in (SOURCE_DIR, HERE) for src in where.glob("*.cuh")}
    cubins = []
    for source in KERNELS:
        files[f"{source}.cu"] = (HERE / f"{source}.cu").read_text()
        cubin = folder / f"{source}.cubin"
        compile_cubin(source, files, f"{source}.cu", cubin)
        problems = check(cubin, KERNELS[source])
        if problems:
            raise RuntimeError(f"{cubin.name}: " + "; ".join(problems))
        cubins.append(cubin)
    return cubins


def loop_mixes(cubin: Path) -> dict[str, collections.Counter]:
    """Per kernel of `cubin`, the opcode counts of its largest loop (the span of its longest backward branch)."""
    mixes = {}
    for name, code in sass.functions(cubin).items():
        spans = [(int(match.group(1), 16), address) for address, text in code
                 if (match := sass.BRANCH.search(text)) and int(match.group(1), 16) < address]
        start, end = max(spans, key=lambda span: span[1] - span[0], default=(0, -1))
        mixes[name] = collections.Counter(_opcode(text) for address, text in code if start <= address <= end)
    return mixes


def _opcode(text: str) -> str:
    words = text.split()
    return words[1] if words[0].startswith("@") else words[0]


def count(mix: collections.Counter, prefix: str) -> int:
    """Instructions of `mix` whose opcode is `prefix` or starts with `prefix.`"""
    return sum(n for opcode, n in mix.items() if opcode == prefix or opcode.startswith(prefix + "."))


def check(cubin: Path, claims: dict[str, dict[str, int]]) -> list[str]:
    """Where a kernel's loop does not hold the instructions KERNELS says it measures."""
    mixes = loop_mixes(cubin)
    problems = []
    for kernel, claim in claims.items():
        mix = mixes.get(kernel)
        if mix is None:
            problems.append(f"{kernel}: not in the cubin")
            continue
        wrong = {prefix: count(mix, prefix) for prefix, n in claim.items() if count(mix, prefix) != n}
        if wrong:
            problems.append(f"{kernel}: loop holds {wrong}, claimed {claim}")
    return problems


class _Driver:
    """The few driver calls the microbenchmarks need (the CUDA context is torch's)."""

    def __init__(self):
        import torch

        torch.zeros(1, device="cuda")  # a current context
        self.torch = torch
        self.cu = ctypes.CDLL("libcuda.so.1")
        self.sms = torch.cuda.get_device_properties(0).multi_processor_count
        self.name = torch.cuda.get_device_name()

    def functions(self, cubin: Path, names) -> dict[str, ctypes.c_void_p]:
        module = ctypes.c_void_p()
        self._ok(self.cu.cuModuleLoadData(ctypes.byref(module), cubin.read_bytes()), f"loading {cubin.name}")
        out = {}
        for name in names:
            function = ctypes.c_void_p()
            self._ok(self.cu.cuModuleGetFunction(ctypes.byref(function), module, name.encode()), name)
            out[name] = function
        return out

    def cycles(self, function, threads: int, iters: int, shared: int = 0):
        """Each warp's cycles (or, in a softmax_beside kernel's second warpgroup, its wgmma groups), (CTA, warp), for a
        launch of one CTA per SM (the second of two launches); None where the launch is refused (registers)."""
        torch = self.torch
        cycles = torch.zeros(self.sms, threads // 32, dtype=torch.int32, device="cuda")
        sink = torch.zeros(self.sms * threads, dtype=torch.int32, device="cuda")
        args = [ctypes.c_uint64(cycles.data_ptr()), ctypes.c_uint64(sink.data_ptr()), ctypes.c_int(iters)]
        params = (ctypes.c_void_p * len(args))(*[ctypes.cast(ctypes.pointer(a), ctypes.c_void_p) for a in args])
        for _ in range(2):
            if self.cu.cuLaunchKernel(function, self.sms, 1, 1, threads, 1, 1, shared, None, params, None) != 0:
                return None
        torch.cuda.synchronize()
        return cycles.double()

    def timed(self, function, iters: int, data):
        """(each warp's cycles (CTA, warp), milliseconds) of the second of two launches of a gemm_ceiling kernel,
        256 threads and one CTA per SM, operands from `data` (a CUDA tensor of CEILING_SHARED_BYTES)."""
        torch = self.torch
        cycles = torch.zeros(self.sms, 8, dtype=torch.int32, device="cuda")
        sink = torch.zeros(self.sms * 256, dtype=torch.int32, device="cuda")
        args = [ctypes.c_uint64(cycles.data_ptr()), ctypes.c_uint64(sink.data_ptr()),
                ctypes.c_uint64(data.data_ptr()), ctypes.c_int(iters)]
        params = (ctypes.c_void_p * len(args))(*[ctypes.cast(ctypes.pointer(a), ctypes.c_void_p) for a in args])
        attribute = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        self._ok(self.cu.cuFuncSetAttribute(function, attribute, CEILING_SHARED_BYTES), "shared memory")
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(2):  # the second launch is timed
            start.record()
            self._ok(self.cu.cuLaunchKernel(function, self.sms, 1, 1, 256, 1, 1, CEILING_SHARED_BYTES, None, params,
                                            None), "launch")
            stop.record()
        torch.cuda.synchronize()
        return cycles.double(), start.elapsed_time(stop)

    @staticmethod
    def _ok(result: int, what: str) -> None:
        if result != 0:
            raise RuntimeError(f"CUDA driver error {result} ({what})")


def run(folder: Path) -> str:
    """The tables, markdown."""
    driver = _Driver()
    rows = [f"Measured on {driver.name} ({driver.sms} SMs), one CTA per SM.", "",
            f"| pipe kernel | cycles per iteration and sub-partition: 1 warp | 2 warps | 4 warps | cycles per "
            f"instruction at 4 warps ({ITERATIONS['pipes']} iterations) |", "|---|---|---|---|---|"]
    pipes = KERNELS["pipes"]
    for name, function in driver.functions(folder / "pipes.cubin", pipes).items():
        print(name, file=sys.stderr)
        per_iteration = []
        for warps in (1, 2, 4):
            cycles = driver.cycles(function, 32 * SUBPARTITIONS * warps, ITERATIONS["pipes"])
            if cycles is None:
                raise RuntimeError(f"{name}: the launch of {warps} warps per sub-partition was refused")
            per_iteration.append(cycles.median().item() / ITERATIONS["pipes"] / warps)
        per_instruction = per_iteration[-1] / sum(pipes[name].values())
        rows.append(f"| {name} | " + " | ".join(f"{c:.1f}" for c in per_iteration) + f" | {per_instruction:.2f} |")
    rows += ["", f"| softmax step | cycles per step: 1 warp per sub-partition | 2 warps (per sub-partition) "
             f"({ITERATIONS['softmax_alone']} steps) |", "|---|---|---|"]
    steps = ITERATIONS["softmax_alone"]
    functions = driver.functions(folder / "softmax_alone.cubin", KERNELS["softmax_alone"])
    for name, function in functions.items():
        if "_beside_" in name:
            continue
        print(name, file=sys.stderr)
        cells = []
        for warps in (1, 2):
            cycles = driver.cycles(function, 32 * SUBPARTITIONS * warps, steps)
            cells.append("-" if cycles is None else f"{cycles.median().item() / steps / warps:.0f}")
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    rows += ["", "| warpgroup beside the softmax's | FP8 step: cycles per step | tensor pipe busy | BF16 step: cycles "
             "per step | tensor pipe busy |", "|---|---|---|---|---|"]
    for issue, wgmmas in BESIDE.items():
        cells = []
        for step in ("softmax", "softmax_bf16"):
            name = f"{step}_beside_{issue}"
            print(name, file=sys.stderr)
            cycles = driver.cycles(functions[name], 2 * 32 * SUBPARTITIONS, steps, GEMM_SHARED_BYTES)
            if cycles is None:
                cells += ["-", "-"]
                continue
            softmax = cycles[:, :SUBPARTITIONS].median().item()
            groups = cycles[:, SUBPARTITIONS:].median().item() if wgmmas else 0.0
            cells += [f"{softmax / steps:.0f}", f"{groups * wgmmas * WGMMA_CYCLES / softmax:.0%}"]
        rows.append(f"| {issue} | " + " | ".join(cells) + " |")
    return "\n".join(rows + [""] + ceiling(driver, folder) + [""] + fetch(driver, folder))


def _random_operands(torch, dtype):
    """CEILING_SHARED_BYTES of random values of `dtype` (normal, as int32 words) on the GPU."""
    values = torch.randn(CEILING_SHARED_BYTES // torch.empty(0, dtype=dtype).element_size(), device="cuda")
    return values.to(dtype).view(torch.int32)


def _torch_gemms(torch) -> list[tuple[str, float]]:
    """(name, TFLOP/s) of torch's GEMMs of GEMM_SIZE^3, the median of 20 timed calls after 10."""
    n = GEMM_SIZE
    a, b = (torch.randn(n, n, device="cuda") for _ in range(2))
    a16, b16 = a.bfloat16(), b.bfloat16()
    a8, b8 = a.to(torch.float8_e4m3fn), b.t().contiguous().to(torch.float8_e4m3fn).t()
    one = torch.ones((), device="cuda")
    calls = {"torch.mm, BF16": lambda: a16 @ b16,
             "torch._scaled_mm, e4m3, fast accumulation": lambda: torch._scaled_mm(
                 a8, b8, one, one, out_dtype=torch.bfloat16, use_fast_accum=True),
             "torch._scaled_mm, e4m3": lambda: torch._scaled_mm(a8, b8, one, one, out_dtype=torch.bfloat16)}
    out = []
    for name, call in calls.items():
        times = []
        for i in range(30):
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            call()
            stop.record()
            torch.cuda.synchronize()
            if i >= 10:
                times.append(start.elapsed_time(stop))
        out.append((name, 2 * n ** 3 / (sorted(times)[len(times) // 2] * 1e-3) / 1e12))
    return out


def fetch(driver, folder: Path) -> list[str]:
    """The code_fetch table, markdown lines: cycles per instruction and sub-partition against the loop's size."""
    rows = [f"| loop body | instructions | cycles per instruction and sub-partition: 1 warp | 2 warps | 4 warps "
            f"({FETCH_INSTRUCTIONS} instructions a warp) |", "|---|---|---|---|---|"]
    for name, function in driver.functions(folder / "code_fetch.cubin", KERNELS["code_fetch"]).items():
        print(name, file=sys.stderr)
        instructions = sum(KERNELS["code_fetch"][name].values())
        iters = FETCH_INSTRUCTIONS // instructions
        cells = []
        for warps in (1, 2, 4):
            cycles = driver.cycles(function, 32 * SUBPARTITIONS * warps, iters)
            cells.append("-" if cycles is None else f"{cycles.median().item() / (iters * instructions * warps):.2f}")
        rows.append(f"| {instructions * SASS_BYTES // 1024} KB | {instructions} | " + " | ".join(cells) + " |")
    return rows


def ceiling(driver, folder: Path) -> list[str]:
    """The gemm_ceiling table, markdown lines."""
    torch = driver.torch
    iters = ITERATIONS["gemm_ceiling"]
    rows = [f"| the step's GEMMs alone ({iters} steps) | cycles per step and warpgroup | SM clock | TFLOP/s |",
            "|---|---|---|---|"]
    dtypes = {"fp8": torch.float8_e4m3fn, "bf16": torch.bfloat16}
    for name, function in driver.functions(folder / "gemm_ceiling.cubin", KERNELS["gemm_ceiling"]).items():
        print(name, file=sys.stderr)
        cycles, ms = driver.timed(function, iters, _random_operands(torch, dtypes[name.split("_")[1]]))
        per_step = cycles.median().item() / iters
        tflops = driver.sms * 2 * iters * CEILING_STEP_FLOP / (ms * 1e-3) / 1e12
        rows.append(f"| {name} | {per_step:.0f} | {cycles.median().item() / (ms * 1e6):.2f} GHz | {tflops:.0f} |")
    rows += ["", f"| torch GEMM, {GEMM_SIZE}^3 | TFLOP/s |", "|---|---|"]
    print("torch GEMMs", file=sys.stderr)
    rows += [f"| {name} | {tflops:.0f} |" for name, tflops in _torch_gemms(torch)]
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m asmgen.sm90a.experiments.microbench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("action", choices=("build", "run"), help="build the cubins here, or run them on the GPU")
    ap.add_argument("--only", choices=("ceiling", "fetch"), help="run: only the gemm_ceiling or the code_fetch table")
    ap.add_argument("folder", type=Path, help="where the cubins go (build) or are (run)")
    args = ap.parse_args()
    if args.action == "build":
        for cubin in build(args.folder):
            print(cubin)
    elif args.only:
        print("\n".join({"ceiling": ceiling, "fetch": fetch}[args.only](_Driver(), args.folder)))
    else:
        print(run(args.folder))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
