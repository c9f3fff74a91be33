"""Benchmark of the sm90a BF16 kernels against cuDNN's and FlashAttention-2's SDPA in the same run (the design's
protocol, with fewer repetitions when asked: see --calls, --warmup, --rounds).

Causal, batch 1, S in --seqlens, max(32, 262144/S) query heads, MHA and GQA 4:1, Gaussian q/k/v with std 0.1 (or
activation-like ones, --inputs activation), throughput = B H S^2 (d_qk + d_v) / time, kernel-only device time (CUDA
graph replays of `calls` calls after `warmup` calls), kernels in rotated order over `rounds` rounds, the median round
reported. Also measured: the relative RMS error against float64 of ours and cuDNN's (on --error-heads heads), the
dispatched kernel on the plain paired job table ("paired", to see what the balanced table gains), the shipped kernel
of the other schedule, and the kernel variants (--variants DIR, a folder with a manifest.json of measurement
builds).
Then the protocol's sustained-clock mode, ZYFA and cuDNN on activation-like inputs (zyfa_tools.inputs) at
--sustained-seqlens, MHA: per repetition 2 s idle, 1 s of back-to-back calls, >= 3 s timed; median of 3.

    python benchmarks/sm90a_bf16.py --out DIR [--seqlens 2048 8192 ...] [--variants DIR] [--sustained-seqlens]
Writes DIR/bench_sm90a.json (rewritten after every configuration, so a run cut short keeps what it measured) and
prints the table last.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import zyfa
import zyfa_kernels
from zyfa.backends import sm90a
from zyfa_tools.inputs import activation_like
from zyfa_tools.reference import attention_fp64

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ci"))
from gpu_common import add_protocol_arguments, causal_flops, device_time_ms, rel_rms, sustained_time_ms, watchdog  # noqa: E402

PEAK_TFLOPS = 989.0  # H100/H200 dense BF16
HEAD_DIMS = tuple(sorted({(k.d_qk, k.d_v) for k in zyfa_kernels.manifest().of("sm90a")}))  # from the manifest
STD = 0.1
LONG_SEQLEN = 16384
SHORT_SEQLEN = 8192  # up to here every configuration gets --calls / --warmup calls
MIN_CALLS = 8
SUSTAINED = {"idle_s": 2.0, "warm_s": 1.0, "timed_s": 3.0, "repeats": 3}  # the design's sustained-clock mode
SUSTAINED_SEQLENS = (8192,)
INPUTS = {"gaussian": f"Gaussian q, k, v with std {STD}",
          "activation": "activation-like q, k, v (zyfa_tools.inputs.activation_like)"}
FIRST_CALL_LIMIT_S = 30.0  # one call of any contender takes milliseconds; the watchdog ends a run that hangs


def heads_for(seqlen: int) -> int:
    return max(32, 262144 // seqlen)


def make_inputs(seqlen, heads, heads_k, d_qk, d_v, kind="gaussian", seed=0):
    """(batch, heads, seqlen, dim) tensors: the SDPA layout; ZYFA takes them with layout="bhsd"."""
    if kind == "activation":
        return tuple(t.transpose(1, 2).to("cuda", torch.bfloat16).contiguous()
                     for t in activation_like(1, seqlen, heads, heads_k, d_qk, d_v, seed=seed))
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = (torch.randn(1, heads, seqlen, d_qk, generator=g, device="cuda") * STD).to(torch.bfloat16)
    k = (torch.randn(1, heads_k, seqlen, d_qk, generator=g, device="cuda") * STD).to(torch.bfloat16)
    v = (torch.randn(1, heads_k, seqlen, d_v, generator=g, device="cuda") * STD).to(torch.bfloat16)
    return q, k, v


def sdpa(backend, q, k, v):
    gqa = q.shape[1] != k.shape[1]
    with sdpa_kernel(backend):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)


def contenders(q, k, v, variants):
    """zyfa (the public call), its kernel on the plain paired job table, the shipped kernel of the other schedule,
    the variants, cuDNN and FA2 SDPA."""
    d_qk, d_v, seqlen = q.shape[-1], v.shape[-1], q.shape[2]
    scale = d_qk ** -0.5
    runs = {"zyfa": lambda: zyfa.flash_attn_func(q, k, v, causal=True, layout="bhsd")}
    dispatched = sm90a.find_kernel(q.dtype, d_qk, d_v, seqlen)
    runs["paired"] = lambda: sm90a.run(dispatched, q, k, v, scale, "bhsd", balanced=False)
    shipped = zyfa_kernels.manifest().kernels
    others = [kern for kern in shipped if kern.target == "sm90a" and kern.d_qk == d_qk and kern.d_v == d_v
              and kern.schedule != dispatched.schedule]
    for name, kernel in [(kern.schedule, kern) for kern in others] + list(variants.items()):
        if kernel.d_qk == d_qk and kernel.d_v == d_v:
            runs[name] = lambda kernel=kernel: sm90a.run(kernel, q, k, v, scale, "bhsd")
    runs["cudnn"] = lambda: sdpa(SDPBackend.CUDNN_ATTENTION, q, k, v)
    if d_qk == d_v == 128:
        runs["fa2"] = lambda: sdpa(SDPBackend.FLASH_ATTENTION, q, k, v)
    return runs


def errors(q, k, v, heads: int):
    """Relative RMS error against float64 of ours and cuDNN's on the first `heads` query heads."""
    group = q.shape[1] // k.shape[1]
    kv = -(-heads // group)
    qs, ks, vs = q[:, :heads].contiguous(), k[:, :kv].contiguous(), v[:, :kv].contiguous()
    ref = attention_fp64(qs.transpose(1, 2), ks.transpose(1, 2), vs.transpose(1, 2))
    ref = ref.transpose(1, 2)
    ours = zyfa.flash_attn_func(qs, ks, vs, causal=True, layout="bhsd")
    cudnn = sdpa(SDPBackend.CUDNN_ATTENTION, qs, ks, vs)
    return {"zyfa": rel_rms(ours, ref), "cudnn": rel_rms(cudnn, ref)}


def calls_for(seqlen: int, calls: int) -> int:
    """Fewer calls for long sequences (time grows as S^2): every timed graph still spans tens of milliseconds."""
    return max(MIN_CALLS, round(calls * min(1.0, (SHORT_SEQLEN / seqlen) ** 2)))


def bench_config(seqlen, heads, heads_k, d_qk, d_v, args, variants):
    q, k, v = make_inputs(seqlen, heads, heads_k, d_qk, d_v, args.inputs)
    runs = contenders(q, k, v, variants)
    flops = causal_flops(1, heads, seqlen, d_qk, d_v)
    calls, warmup = calls_for(seqlen, args.calls), calls_for(seqlen, args.warmup)
    names = list(runs)
    times = {name: [] for name in names}
    for name in names:  # one call each, waited for: a contender that never finishes stops the run, named
        with watchdog(f"{name} at S = {seqlen}, heads {heads}/{heads_k}, d {d_qk}/{d_v}", FIRST_CALL_LIMIT_S):
            try:
                runs[name]()
                torch.cuda.synchronize()
            except RuntimeError:  # a peer that declines: reported by the timing below
                pass
    for rnd in range(args.rounds):
        order = names[rnd % len(names):] + names[:rnd % len(names)]
        for name in order:
            try:
                times[name].append(device_time_ms(runs[name], calls, warmup))
            except RuntimeError as error:  # a peer that declines the configuration
                print(f"  {name}: {str(error).splitlines()[0]}", file=sys.stderr)
                times[name] = None
                names.remove(name)
                break
    row = {"seqlen": seqlen, "heads": heads, "heads_k": heads_k, "d_qk": d_qk, "d_v": d_v, "calls": calls,
           "warmup": warmup, "tflops": {}, "ms": {}}
    for name, ts in times.items():
        if ts:
            ms = statistics.median(ts)
            row["ms"][name] = ms
            row["tflops"][name] = flops / ms / 1e9
    if seqlen <= args.error_max_seqlen:
        row["rel_rms_vs_fp64"] = errors(q, k, v, args.error_heads)
    return row


def sustained_config(seqlen, d_qk, d_v, protocol: dict) -> dict:
    """Sustained-clock throughput of ZYFA and cuDNN on activation-like inputs (MHA, the protocol's heads)."""
    heads = heads_for(seqlen)
    q, k, v = make_inputs(seqlen, heads, heads, d_qk, d_v, "activation")
    runs = {"zyfa": lambda: zyfa.flash_attn_func(q, k, v, causal=True, layout="bhsd"),
            "cudnn": lambda: sdpa(SDPBackend.CUDNN_ATTENTION, q, k, v)}
    flops = causal_flops(1, heads, seqlen, d_qk, d_v)
    row = {"seqlen": seqlen, "heads": heads, "heads_k": heads, "d_qk": d_qk, "d_v": d_v, "inputs": "activation",
           "ms": {}, "tflops": {}}
    for name, fn in runs.items():
        row["ms"][name] = statistics.median(sustained_time_ms(fn, **protocol))
        row["tflops"][name] = flops / row["ms"][name] / 1e9
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_protocol_arguments(ap)
    ap.add_argument("--variants", help="folder with a manifest.json of kernel variants to time as well")
    ap.add_argument("--sustained-seqlens", type=int, nargs="*", default=list(SUSTAINED_SEQLENS),
                    help="S of the sustained-clock runs on activation-like inputs (none: skip them)")
    ap.add_argument("--inputs", choices=("gaussian", "activation"), default="gaussian",
                    help="q/k/v of the main table: the protocol's Gaussians (std 0.1), or activation-like ones "
                         "(zyfa_tools.inputs: an attention sink, local structure; where the row maxima settle in the "
                         "first key tile, as with real models)")
    ap.add_argument("--quick-sustained", action="store_true",
                    help="a tenth of the sustained-clock durations, one repetition (a rehearsal, not the protocol)")
    args = ap.parse_args()
    sustained_protocol = dict(SUSTAINED)
    if args.quick_sustained:
        sustained_protocol = {**{k: v / 10 for k, v in SUSTAINED.items() if k != "repeats"}, "repeats": 1}

    variants = {}
    if args.variants:
        variants = {k.name: k for k in zyfa_kernels.Manifest.from_file(Path(args.variants) / "manifest.json").kernels}
    wanted = {int(d) for d in args.head_dims.split(",")}
    rows, sustained = [], []
    report = {
        "device": torch.cuda.get_device_name(), "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version(), "zyfa": zyfa.__version__,
        "protocol": {"calls": args.calls, "warmup": args.warmup, "rounds": args.rounds, "idle_s": args.idle,
                     "inputs": args.inputs, "sustained": sustained_protocol},
        "rows": rows,  # filled as configurations are measured
        "sustained": sustained,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    save(out, report)  # then again after every measurement: a run cut short keeps what it measured
    for d_qk, d_v in HEAD_DIMS:
        if d_qk not in wanted:
            continue
        for seqlen in args.seqlens:
            heads = heads_for(seqlen)
            for heads_k in (heads, heads // 4):
                if seqlen >= LONG_SEQLEN:
                    time.sleep(args.idle)
                rows.append(bench_config(seqlen, heads, heads_k, d_qk, d_v, args, variants))
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
                save(out, report)
    for d_qk, d_v in HEAD_DIMS:
        for seqlen in args.sustained_seqlens if d_qk in wanted else ():
            sustained.append(sustained_config(seqlen, d_qk, d_v, sustained_protocol))
            print(json.dumps(sustained[-1]), file=sys.stderr, flush=True)
            save(out, report)
    print_table(rows)
    return 0


def save(out: Path, report: dict) -> None:
    (out / "bench_sm90a.json").write_text(json.dumps(report, indent=1))
    (out / "bench_sm90a.md").write_text(markdown(report))


def markdown(report) -> str:
    """The results table for benchmarks/results/: versions, machine, ratios, fraction of peak, errors."""
    p = report["protocol"]
    lines = [
        f"# sm90a BF16 causal forward: {report['device']}",
        "",
        f"torch {report['torch']}, cuDNN {report['cudnn']}, zyfa {report['zyfa']}. Kernel-only device time (CUDA "
        f"graph replays), median of {p['rounds']} rounds in rotated order; up to S = {SHORT_SEQLEN} {p['calls']} "
        f"timed calls after {p['warmup']} warm-up calls, fewer beyond (S^2 scaling, at least {MIN_CALLS}); "
        f"{p['idle_s']} s idle before S >= {LONG_SEQLEN}. TFLOP/s = B H S^2 (d_qk + d_v) / time; peak "
        f"{PEAK_TFLOPS:.0f}. Inputs: {INPUTS[p.get('inputs', 'gaussian')]}. Errors: relative RMS vs float64 on the "
        f"first query heads (S <= 8K).",
        "",
        "| d_qk/d_v | S | heads q/kv | zyfa | cuDNN | FA2 | zyfa / cuDNN | % of peak | other schedule | "
        "err zyfa | err cuDNN |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    nan = float("nan")
    for r in report["rows"]:
        t, err = r["tflops"], r.get("rel_rms_vs_fp64", {})
        other = next((f"{v:.0f}" for n, v in t.items() if n in ("pingpong", "independent")), "")
        fa2 = f"{t['fa2']:.0f}" if "fa2" in t else "n/a"
        lines.append(
            f"| {r['d_qk']}/{r['d_v']} | {r['seqlen']} | {r['heads']}/{r['heads_k']} | {t.get('zyfa', nan):.0f} | "
            f"{t.get('cudnn', nan):.0f} | {fa2} | {t.get('zyfa', nan) / t.get('cudnn', nan):.3f} | "
            f"{100 * t.get('zyfa', nan) / PEAK_TFLOPS:.1f} | {other} | {err.get('zyfa', nan):.2e} | "
            f"{err.get('cudnn', nan):.2e} |")
    if report.get("sustained"):
        sp = p["sustained"]
        lines += ["", f"Sustained clocks, activation-like inputs, MHA ({sp['idle_s']} s idle, {sp['warm_s']} s of "
                  f"back-to-back calls, >= {sp['timed_s']} s timed, median of {sp['repeats']}), TFLOP/s:", "",
                  "| d_qk/d_v | S | heads | zyfa | cuDNN | zyfa / cuDNN |", "|---|---|---|---|---|---|"]
        for r in report["sustained"]:
            t = r["tflops"]
            lines.append(f"| {r['d_qk']}/{r['d_v']} | {r['seqlen']} | {r['heads']} | {t['zyfa']:.0f} | "
                         f"{t['cudnn']:.0f} | {t['zyfa'] / t['cudnn']:.3f} |")
    variants = sorted({n for r in report["rows"] for n in r["tflops"]} - {"zyfa", "cudnn", "fa2"})
    if variants:
        lines += ["", "Variants (TFLOP/s):", "", "| d_qk | S | heads q/kv | " + " | ".join(variants) + " |",
                  "|---|---|---|" + "---|" * len(variants)]
        for r in report["rows"]:
            cells = " | ".join(f"{r['tflops'][n]:.0f}" if n in r["tflops"] else "" for n in variants)
            lines.append(f"| {r['d_qk']} | {r['seqlen']} | {r['heads']}/{r['heads_k']} | {cells} |")
    return "\n".join(lines) + "\n"


def print_table(rows):
    others = sorted({n for r in rows for n in r["tflops"]} - {"zyfa", "cudnn", "fa2"})
    head = f"{'d':>7} {'S':>6} {'H/Hk':>7} {'zyfa':>6} {'cudnn':>6} {'fa2':>6} {'x cuDNN':>7} {'%peak':>6}"
    head += "".join(f" {n[-14:]:>14}" for n in others) + f" {'err zyfa':>9} {'err cuDNN':>9}"
    print(head)
    for r in rows:
        t = r["tflops"]
        ratio = t.get("zyfa", 0) / t["cudnn"] if t.get("cudnn") else float("nan")
        err = r.get("rel_rms_vs_fp64", {})
        line = (f"{r['d_qk']:>3}/{r['d_v']:<3} {r['seqlen']:>6} {r['heads']:>3}/{r['heads_k']:<3} "
                f"{t.get('zyfa', 0):>6.0f} {t.get('cudnn', 0):>6.0f} {t.get('fa2', 0):>6.0f} {ratio:>7.3f} "
                f"{100 * t.get('zyfa', 0) / PEAK_TFLOPS:>6.1f}")
        line += "".join(f" {t.get(n, 0):>14.0f}" for n in others)
        line += f" {err.get('zyfa', float('nan')):>9.2e} {err.get('cudnn', float('nan')):>9.2e}"
        print(line)


if __name__ == "__main__":
    sys.exit(main())
