"""What the MI355X (gfx950) validation checks and measures, and how its results read: the configuration lists, the
tolerances and verdict of one accuracy case, the benchmark's configurations, the markdown table and the summary.

Pure (no GPU, no torch): ci/gpu_check_gfx950.py and ci/bench_gfx950.py use it on the MI355X and the CPU tests use it
anywhere. As a script it prints the summary of a finished run (the last stage of ci/gpu.sh on gfx950):

    python -m ci.gfx950_validation [--out DIR]     reads DIR/gpu_check_gfx950.json and DIR/bench_gfx950.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import zyfa_kernels

# (d_qk, d_v) of the gfx950 FP8 kernels, from the manifest (read without the native loader)
HEAD_DIMS = tuple(sorted({(k.d_qk, k.d_v) for k in zyfa_kernels.manifest().of("gfx950") if k.dtype == "fp8e4m3"}))
DESCALE_FORMS = ("per_kv_head", "one_element", "float", "expanded")  # what flash_attn_func accepts for FP8
LAYOUTS = ("bshd", "bhsd")
# Input kinds: Gaussian entries of std 1 (the simulator tests' inputs), std 4 (scores spread over many binades, so
# the lazy rescaling and block exponents e != 0 occur often), and zyfa_tools.inputs.activation_like (an attention
# sink, a long tail 8-14 binades down, local peaks, K outlier channels, RoPE).
INPUT_STD = {"gaussian": 1.0, "gaussian_wide": 4.0}
INPUT_KINDS = (*INPUT_STD, "activation")

CHECK_JSON = "gpu_check_gfx950.json"
BENCH_JSON = "bench_gfx950.json"
BENCH_MD = "bench_gfx950.md"


@dataclass(frozen=True)
class Case:
    """One accuracy configuration (run for every head-dim pair)."""

    batch: int
    seqlen: int
    heads: int
    heads_k: int
    layout: str
    inputs: str
    descale: str

    def __post_init__(self):
        if self.layout not in LAYOUTS or self.inputs not in INPUT_KINDS or self.descale not in DESCALE_FORMS:
            raise ValueError(f"bad case {self}")
        if self.heads % self.heads_k:
            raise ValueError(f"heads {self.heads} must be a multiple of heads_k {self.heads_k}")

    @property
    def label(self) -> str:
        return (f"b{self.batch} s{self.seqlen} h{self.heads}/{self.heads_k} {self.layout} {self.inputs} "
                f"{self.descale}")


# Odd lengths exercise the padding to 256; MHA, GQA and MQA; both layouts; batch > 1; every descale form; every kind
# of input. (2, 1280, 64, 8): 5 query tiles make 3 jobs per head, 384 jobs on the 256-workgroup persistent grid, so
# workgroups walk several jobs of different heads and batches.
CHECK_CASES = (
    Case(1, 256, 2, 2, "bshd", "gaussian", "per_kv_head"),
    Case(1, 1000, 4, 4, "bshd", "activation", "per_kv_head"),
    Case(2, 777, 8, 2, "bhsd", "gaussian", "one_element"),
    Case(1, 1536, 8, 1, "bshd", "activation", "float"),
    Case(3, 300, 6, 3, "bshd", "gaussian_wide", "expanded"),
    Case(1, 333, 2, 1, "bhsd", "activation", "one_element"),
    Case(1, 2048, 8, 2, "bhsd", "gaussian_wide", "per_kv_head"),
    Case(2, 1280, 64, 8, "bshd", "gaussian", "per_kv_head"),
    Case(1, 4096, 4, 1, "bhsd", "activation", "per_kv_head"),
)
SMALL_CASES = (Case(1, 384, 2, 1, "bshd", "gaussian", "per_kv_head"),)

# Kernel vs the numerics model (zyfa.numerics with the kernel's p_mode, tile_n, scale_block and tau from the
# manifest): as in the ISA simulator's tests (asmgen/tests/test_sim_kernels.py), the kernel differs only by FP32
# summation order and exp2's last bits, so few outputs differ at all (an exact-P probability on the other side of
# an e4m3 rounding boundary moves an output by more than a BF16 step) and lse agrees to float32 rounding. Also, as
# in the sm90a check, the kernel's distance from the model must be a small fraction of the model's own error.
MAX_MODEL_REL_RMS = 1e-3  # ||out - model|| / ||model||
MAX_MODEL_DIFFERING = 1e-3  # fraction of output elements not bitwise equal to the model's
MAX_MODEL_LSE = 1e-5  # |lse - model lse| <= MAX_MODEL_LSE * (1 + |model lse|)
MAX_MODEL_DISTANCE = 0.1  # rel. RMS distance kernel - model, as a fraction of the model's rel. RMS error vs fp64
# Kernel vs float64 attention on the same decoded FP8 inputs (zyfa_tools.reference). Output: the bound the API
# tests hold the model to (packages/zyfa-torch/tests/conftest.py, OUT_RTOL for FP8; the model gives 4e-3..4e-2 on
# these cases). lse: lean P's lse is biased high (the sum of its rounded probabilities exceeds the exact one by up to
# about 10%); the model reaches 0.105 on the activation-like MQA case at S=1536, so the bound is wider than the API
# tests' 0.11.
MAX_FP64_REL_RMS = 6e-2
MAX_FP64_LSE = 0.15


def verdict(r: dict) -> list[str]:
    """The failed criteria of one accuracy result (a dict as ci/gpu_check_gfx950.py writes it); [] when it passes."""
    failed = []
    if not r["backend_ok"]:
        failed.append(f"backend {r['backend']} (expected gfx950)")
    if not r["finite"]:
        failed.append("unwritten or non-finite outputs (poisoned allocation shows through)")
    if not r["deterministic"]:
        failed.append("not bitwise deterministic")
    checks = (
        ("rel_rms_vs_model", MAX_MODEL_REL_RMS),
        ("frac_differing_vs_model", MAX_MODEL_DIFFERING),
        ("lse_vs_model", MAX_MODEL_LSE),  # max |lse - model lse| / (1 + |model lse|)
        ("rel_rms_vs_fp64", MAX_FP64_REL_RMS),
        ("max_lse_diff_vs_fp64", MAX_FP64_LSE),
    )
    for key, limit in checks:
        if not r[key] <= limit:  # NaN fails
            failed.append(f"{key} {r[key]:.3g} > {limit:g}")
    distance_limit = MAX_MODEL_DISTANCE * r["model_rel_rms_vs_fp64"]
    if not r["rel_rms_vs_model"] <= distance_limit:
        failed.append(f"rel_rms_vs_model {r['rel_rms_vs_model']:.3g} > {MAX_MODEL_DISTANCE} x model error "
                      f"{r['model_rel_rms_vs_fp64']:.3g}")
    return failed


def check_configurations(small: bool = False) -> list[tuple[Case, tuple[int, int]]]:
    """Every (case, (d_qk, d_v)) the check runs, head dims outermost."""
    cases = SMALL_CASES if small else CHECK_CASES
    return [(case, dims) for dims in HEAD_DIMS for case in cases]


# ---- benchmark ----------------------------------------------------------------------------------------------------

SEQLENS = (2048, 4096, 8192, 16384, 32768)
SUSTAINED_SEQLENS = (8192,)
GQA_GROUP = 4
LONG_SEQLEN = 16384  # protocol: idle before S >= 16K
SHORT_SEQLEN = 8192  # up to here every configuration gets the full number of calls
MIN_CALLS = 8
# AMD's published dense peaks of the MI355X (TFLOP/s): FP8 for ZYFA and AITER, BF16 for SDPA.
PEAK_TFLOPS = {"fp8": 5033.0, "bf16": 2516.6}
CONTENDERS = ("zyfa", "sdpa", "aiter")  # zyfa FP8, torch SDPA BF16, AITER FP8
CONTENDER_TITLES = {"zyfa": "zyfa FP8", "sdpa": "SDPA BF16", "aiter": "AITER FP8"}


def heads_for(seqlen: int) -> int:
    """The protocol's query heads: max(32, 262144 / S)."""
    return max(32, 262144 // seqlen)


def bench_configurations(seqlens=SEQLENS, head_dims=HEAD_DIMS) -> list[dict]:
    """Causal MHA and GQA (4 query heads per KV head), batch 1, per (d_qk, d_v) and S, in the protocol's order."""
    configs = []
    for d_qk, d_v in head_dims:
        for seqlen in seqlens:
            heads = heads_for(seqlen)
            for heads_k in (heads, heads // GQA_GROUP):
                configs.append({"batch": 1, "seqlen": seqlen, "heads": heads, "heads_k": heads_k, "d_qk": d_qk,
                                "d_v": d_v})
    return configs


def calls_for(seqlen: int, calls: int) -> int:
    """Fewer calls for long sequences (time grows as S^2), at least MIN_CALLS."""
    return max(MIN_CALLS, round(calls * min(1.0, (SHORT_SEQLEN / seqlen) ** 2)))


def rotated(names: list[str], round_index: int) -> list[str]:
    """The contenders' order in one round: rotated by one per round."""
    if not names:
        return []
    shift = round_index % len(names)
    return names[shift:] + names[:shift]


def tflops(flops: float, ms: float) -> float:
    return flops / ms / 1e9


def _cell(x, fmt: str) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def _ratio(a, b):
    return a / b if a and b else None


def markdown(report: dict) -> str:
    """The results table: versions, machine, protocol, TFLOP/s, ratios, fraction of peak, errors vs float64."""
    p = report["protocol"]
    aiter = report.get("aiter") or f"not measured ({report.get('aiter_note', 'aiter is not importable')})"
    lines = [
        f"# gfx950 FP8 causal forward: {report['device']}",
        "",
        f"torch {report['torch']} (HIP {report.get('hip')}), zyfa {report['zyfa']}, AITER {aiter}. Kernel-only "
        f"device time (graph replays of the calls; torch.profiler's kernel times where a contender cannot be "
        f"captured), median of {p['rounds']} rounds in rotated order; up to S = {SHORT_SEQLEN} {p['calls']} timed "
        f"calls after {p['warmup']} warm-up calls, fewer beyond (S^2 scaling, at least {MIN_CALLS}); "
        f"{p['idle_s']} s idle before S >= {LONG_SEQLEN}. Gaussian inputs of std 0.1, batch 1. TFLOP/s = "
        f"B H S^2 (d_qk + d_v) / time; peaks "
        f"{PEAK_TFLOPS['fp8']:.0f} (FP8) and {PEAK_TFLOPS['bf16']:.0f} (BF16). Errors: relative RMS vs float64 on "
        f"each contender's own inputs (FP8 decoded, BF16), first query heads, S <= {p['error_max_seqlen']}.",
        "",
        "| d_qk/d_v | S | heads q/kv | zyfa FP8 | SDPA BF16 | AITER FP8 | zyfa / SDPA | zyfa / AITER | % of FP8 peak | "
        "err zyfa | err SDPA | err AITER |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["rows"]:
        t, err = r["tflops"], r.get("rel_rms_vs_fp64", {})
        zyfa = t.get("zyfa")
        lines.append(
            f"| {r['d_qk']}/{r['d_v']} | {r['seqlen']} | {r['heads']}/{r['heads_k']} | {_cell(zyfa, '.0f')} | "
            f"{_cell(t.get('sdpa'), '.0f')} | {_cell(t.get('aiter'), '.0f')} | "
            f"{_cell(_ratio(zyfa, t.get('sdpa')), '.3f')} | {_cell(_ratio(zyfa, t.get('aiter')), '.3f')} | "
            f"{_cell(100 * zyfa / PEAK_TFLOPS['fp8'] if zyfa else None, '.1f')} | {_cell(err.get('zyfa'), '.2e')} | "
            f"{_cell(err.get('sdpa'), '.2e')} | {_cell(err.get('aiter'), '.2e')} |")
    if report.get("sustained"):
        s = report["sustained_protocol"]
        lines += [
            "",
            f"Sustained clocks, activation-like inputs (zyfa_tools.inputs.activation_like): per repetition "
            f"{s['idle_s']} s idle, {s['warm_s']} s of back-to-back calls, then at least {s['timed_s']} s timed; "
            f"median of {s['repeats']} repetitions (TFLOP/s).",
            "",
            "| d_qk/d_v | S | heads q/kv | zyfa FP8 | SDPA BF16 | AITER FP8 | zyfa / SDPA | zyfa / AITER |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in report["sustained"]:
            t = r["tflops"]
            zyfa = t.get("zyfa")
            lines.append(
                f"| {r['d_qk']}/{r['d_v']} | {r['seqlen']} | {r['heads']}/{r['heads_k']} | {_cell(zyfa, '.0f')} | "
                f"{_cell(t.get('sdpa'), '.0f')} | {_cell(t.get('aiter'), '.0f')} | "
                f"{_cell(_ratio(zyfa, t.get('sdpa')), '.3f')} | {_cell(_ratio(zyfa, t.get('aiter')), '.3f')} |")
    declined = sorted({f"{name}: {why}" for r in report["rows"] + report.get("sustained", [])
                       for name, why in r.get("declined", {}).items()})
    if declined:
        lines += ["", "Declined or failed (n/a above):", ""] + [f"- {d}" for d in declined]
    return "\n".join(lines) + "\n"


def bench_table(rows: list[dict]) -> list[str]:
    """The benchmark's plain-text table (printed last by the benchmark)."""
    out = [f"{'d':>7} {'S':>6} {'H/Hk':>7} {'zyfa':>6} {'sdpa':>6} {'aiter':>6} {'x sdpa':>7} {'x aiter':>7} "
           f"{'%peak':>6} {'err zyfa':>9}"]
    for r in rows:
        t = r["tflops"]
        zyfa = t.get("zyfa")
        err = r.get("rel_rms_vs_fp64", {}).get("zyfa")
        out.append(f"{r['d_qk']:>3}/{r['d_v']:<3} {r['seqlen']:>6} {r['heads']:>3}/{r['heads_k']:<3} "
                   f"{_cell(zyfa, '6.0f'):>6} {_cell(t.get('sdpa'), '6.0f'):>6} {_cell(t.get('aiter'), '6.0f'):>6} "
                   f"{_cell(_ratio(zyfa, t.get('sdpa')), '7.3f'):>7} {_cell(_ratio(zyfa, t.get('aiter')), '7.3f'):>7} "
                   f"{_cell(100 * zyfa / PEAK_TFLOPS['fp8'] if zyfa else None, '6.1f'):>6} "
                   f"{_cell(err, '9.2e'):>9}")
    return out


def check_failures(check: dict) -> list[str]:
    """Every failed item of a check report, as lines."""
    lines = []
    for r in check.get("accuracy", []):
        if not r["ok"]:
            lines.append(f"accuracy {r['d_qk']}/{r['d_v']} {r['case']}: {'; '.join(r['failed'])}")
    for key in ("graph", "compile", "large"):
        for r in check.get(key, []):
            if not r["ok"]:
                lines.append(f"{key}: {r}")
    return lines


def summary_lines(check: dict | None, bench: dict | None) -> list[str]:
    """A few lines on a finished gfx950 run: the check's verdict and the benchmark's ratios."""
    lines = []
    if check is None:
        lines.append("check: no results")
    else:
        items = sum(len(check.get(key, [])) for key in ("accuracy", "graph", "compile", "large"))
        failures = check_failures(check)
        acc = [r for r in check.get("accuracy", []) if "rel_rms_vs_model" in r]
        worst = max((r["rel_rms_vs_model"] for r in acc), default=float("nan"))
        worst64 = max((r["rel_rms_vs_fp64"] for r in acc), default=float("nan"))
        lines.append(f"check on {check.get('device', '?')} ({check.get('backend', '?')} backend): "
                     f"{items - len(failures)}/{items} passed; worst rel. RMS vs model {worst:.2e}, "
                     f"vs float64 {worst64:.2e}")
        lines += [f"  FAILED {f}" for f in failures]
    if bench is None:
        lines.append("bench: no results")
    else:
        rows = bench.get("rows", [])
        for peer in ("sdpa", "aiter"):
            ratios = [_ratio(r["tflops"].get("zyfa"), r["tflops"].get(peer)) for r in rows]
            ratios = [x for x in ratios if x]
            if ratios:
                geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
                lines.append(f"bench: zyfa FP8 / {CONTENDER_TITLES[peer]}: geometric mean {geo:.3f} over "
                             f"{len(ratios)} configurations (range {min(ratios):.3f}-{max(ratios):.3f})")
            else:
                note = bench.get("aiter_note", "") if peer == "aiter" else ""
                lines.append(f"bench: no {CONTENDER_TITLES[peer]} figures{': ' + note if note else ''}")
        best = max((r["tflops"].get("zyfa", 0) for r in rows), default=0)
        if best:
            share = 100 * best / PEAK_TFLOPS["fp8"]
            lines.append(f"bench: best zyfa FP8 {best:.0f} TFLOP/s ({share:.1f}% of FP8 peak)")
    return lines


def _read(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="out")
    args = ap.parse_args(argv)
    out = Path(args.out)
    check, bench = _read(out / CHECK_JSON), _read(out / BENCH_JSON)
    print("\n".join(["gfx950 summary:", *summary_lines(check, bench)]))
    return 0  # a report only: ci/gpu.sh fails the run on the check's and the benchmark's own exit status


if __name__ == "__main__":
    sys.exit(main())
