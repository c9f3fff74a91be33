"""Results as a table (stdout and bench.md), CSV, JSON, and plots: throughput against S per configuration, error
against speed."""

from __future__ import annotations

import csv
import json
from pathlib import Path

CSV_FIELDS = ("dtype", "d_qk", "d_v", "seqlen", "heads", "heads_k", "kind", "inputs", "contender", "tflops",
              "eager_tflops", "kernel_ms", "eager_ms", "kernel_method", "error_vs_fp64", "ratio_to_zyfa", "note")


def _ratios(rows: list[dict]) -> list[dict]:
    """Each row with ratio_to_zyfa: ZYFA's kernel throughput over the row's, in the same configuration."""
    zyfa = {_key(r): r["tflops"] for r in rows if r["contender"] == "zyfa"}
    return [{**r, "ratio_to_zyfa": zyfa[_key(r)] / r["tflops"] if _key(r) in zyfa else None} for r in rows]


def _key(row: dict) -> tuple:
    return row["dtype"], row["d_qk"], row["d_v"], row["seqlen"], row["heads"], row["heads_k"]


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def header(results: dict) -> list[str]:
    m, p = results["machine"], results["protocol"]
    gpu = m.get("gpu", {}).get("name") or m.get("cpu", "")
    smi = m.get("nvidia_smi") or {}
    clocks = (f"; SM clock {smi.get('clocks.sm')} (max {smi.get('clocks.max.sm')}), power limit "
              f"{smi.get('power.limit')}" if "clocks.sm" in smi else "")
    v = m["versions"]
    soft = ", ".join(f"{name} {v[name]}" for name in v if v[name] is not None)
    timing = (f"sustained clocks: {p['sustained']}" if p["sustained"] else
              f"{p['calls']} calls after {p['warmup']} warm-up calls, median of {p['rounds']} rounds in rotated "
              f"order, {p['idle_s']} s idle before S >= {p['idle_from_seqlen']}")
    return [f"Device: {m['device']} {gpu}{clocks}.", f"Software: {soft}.",
            f"Protocol: {p['inputs']} inputs, causal, batch 1; {timing}. TFLOP/s = B H S^2 (d_qk + d_v) / time "
            f"(kernel-only time; 'eager' per call). Error: relative RMS against float64 on the first "
            f"{p['error_heads']} query heads (S <= {p['error_max_seqlen']}).", f"Command: {m['command']}"]


def table(results: dict) -> str:
    """A markdown table, one line per (configuration, contender), then the skips grouped by reason."""
    lines = ["| dtype | d_qk/d_v | S | heads | contender | TFLOP/s | eager TFLOP/s | ms | eager ms | zyfa / this | "
             "error vs fp64 | timing |", "|" + "---|" * 12]
    for r in _ratios(results["rows"]):
        lines.append(f"| {r['dtype']} | {r['d_qk']}/{r['d_v']} | {r['seqlen']} | {r['heads']}/{r['heads_k']} | "
                     f"{r['contender']} | {_fmt(r['tflops'], '.4g')} | {_fmt(r['eager_tflops'], '.4g')} | "
                     f"{_fmt(r['kernel_ms'], '.4g')} | {_fmt(r['eager_ms'], '.4g')} | "
                     f"{_fmt(r['ratio_to_zyfa'], '.3f')} | {_fmt(r['error_vs_fp64'], '.2e')} | "
                     f"{r['kernel_method']} |")
    skips: dict[tuple, list] = {}
    for s in results["skips"]:
        skips.setdefault((s["contender"], s["reason"]), []).append(s)
    if skips:
        lines += ["", "Not measured:"]
        for (name, reason), where in skips.items():
            cells = sorted({f"{s['dtype']} d{s['d_qk']}/{s['d_v']}" for s in where})
            lines.append(f"- {name}: {reason} ({len(where)} configurations: {', '.join(cells)})")
    return "\n".join(lines)


def save(results: dict, out: Path, plots: bool = True) -> list[Path]:
    """bench.json, bench.csv, bench.md and (plots=True, with matplotlib) throughput.png, error_vs_speed.png."""
    out = Path(out)
    (out / "bench.json").write_text(json.dumps(results, indent=1))
    with open(out / "bench.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(_ratios(results["rows"]))
    (out / "bench.md").write_text("# ZYFA benchmark\n\n" + "\n".join(header(results)) + "\n\n" + table(results)
                                  + "\n")
    written = [out / "bench.json", out / "bench.csv", out / "bench.md"]
    if plots and results["rows"]:
        written += plot(results, out)
    return written


def plot(results: dict, out: Path) -> list[Path]:
    """Throughput against S, one panel per (dtype, head dims, MHA/GQA), one line per contender; and error against
    throughput, one panel per dtype. Returns the files written (none without matplotlib)."""
    try:
        import matplotlib
    except ImportError:
        return []
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = results["rows"]
    series = sorted({(r["dtype"], r["d_qk"], r["d_v"], r["kind"]) for r in rows})
    contenders = sorted({r["contender"] for r in rows}, key=lambda n: (n != "zyfa", n))
    colors = {n: plt.get_cmap("tab10").colors[i % 10] for i, n in enumerate(contenders)}
    cols = min(4, len(series))
    fig, axes = plt.subplots(-(-len(series) // cols), cols, figsize=(4.2 * cols, 3.4 * -(-len(series) // cols)),
                             squeeze=False)
    for ax, key in zip(axes.flat, series, strict=False):
        for name in contenders:
            pts = sorted((r["seqlen"], r["tflops"]) for r in rows
                         if (r["dtype"], r["d_qk"], r["d_v"], r["kind"]) == key and r["contender"] == name)
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", label=name, color=colors[name])
        ax.set_xscale("log", base=2)
        ax.set_title(f"{key[0]} d {key[1]}/{key[2]} {key[3]}", fontsize=9)
        ax.set_xlabel("S")
        ax.set_ylabel("TFLOP/s (kernel)")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(series):]:
        ax.set_visible(False)
    handles = [plt.Line2D([], [], color=colors[n], marker="o", label=n) for n in contenders]
    fig.legend(handles=handles, loc="lower center", ncol=len(contenders), fontsize=8)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(out / "throughput.png", dpi=110)
    plt.close(fig)
    written = [out / "throughput.png"]

    measured = [r for r in rows if r["error_vs_fp64"] is not None]
    dtypes = sorted({r["dtype"] for r in measured})
    if dtypes:
        fig, axes = plt.subplots(1, len(dtypes), figsize=(5.5 * len(dtypes), 4), squeeze=False)
        for ax, dtype in zip(axes[0], dtypes, strict=True):
            for name in contenders:
                pts = [(r["tflops"], r["error_vs_fp64"]) for r in measured if r["dtype"] == dtype
                       and r["contender"] == name]
                if pts:
                    ax.scatter(*zip(*pts, strict=True), label=name, color=colors[name])
            ax.set_yscale("log")
            ax.set_xlabel("TFLOP/s (kernel)")
            ax.set_ylabel("relative RMS error vs float64")
            ax.set_title(f"{dtype}: error against speed (lower right is better)", fontsize=9)
            ax.grid(alpha=0.3, which="both")
            ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "error_vs_speed.png", dpi=110)
        plt.close(fig)
        written.append(out / "error_vs_speed.png")
    return written
