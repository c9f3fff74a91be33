"""Command line of the gfx950 simulator.

    python -m asmgen.sim run --kernel fp8_d128 --seqlen 512 --heads 4 --kv-heads 1 --seed 0
    python -m asmgen.sim run --kernel fp8_d128_exact --seqlen 256 --heads 2 --kv-heads 1
    python -m asmgen.sim table          # the implemented instructions and the source of their semantics

`run` executes the committed code object of a gfx950 FP8 kernel on activation-like inputs (a sink key, outlier
channels, RoPE, local correlation; quantized to e4m3 with one descale per tensor and KV head), compares with the
numerics model zyfa.numerics (at the configuration of the kernel's manifest entry: p_mode, p_shift, tau, scale
block, row sum, key tile) and prints, as its last line, the relative error
||out - model|| / ||model|| over the simulated rows.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

LAST_LINE = "relative error vs model: {:.3e}"


def _inputs(batch, seqlen, heads, heads_k, d_qk, d_v, seed, kind):
    from zyfa_tools import inputs
    if kind == "activation" and hasattr(inputs, "activation_like"):
        return inputs.activation_like(batch, seqlen, heads, heads_k, d_qk, d_v, seed=seed), "activation-like"
    return inputs.gaussian(batch, seqlen, heads, heads_k, d_qk, d_v, seed=seed, std=1.0), "gaussian"


def _progress(done: int, total: int) -> None:
    width = 30
    filled = width * done // total
    print(f"\r  workgroups [{'#' * filled}{'.' * (width - filled)}] {done}/{total}", end="", file=sys.stderr,
          flush=True)
    if done == total:
        print(file=sys.stderr)


def run(args) -> int:
    import zyfa.numerics
    from zyfa_tools.inputs import quantize

    from .attention import manifest_entry, run_attention
    entry, code = manifest_entry(args.kernel)
    (q, k, v), kind = _inputs(args.batch, args.seqlen, args.heads, args.kv_heads, entry["d_qk"], entry["d_v"],
                              args.seed, args.inputs)
    dtype = torch.bfloat16 if entry["dtype"] == "bf16" else torch.float8_e4m3fn
    q8, k8, v8, descales = quantize(q, k, v, dtype)
    qd, kd, vd = (descales.get(f"{n}_descale", 1.0) for n in "qkv")  # BF16: no descales
    print(f"{args.kernel}: batch {args.batch}, seqlen {args.seqlen}, heads {args.heads}/{args.kv_heads}, "
          f"{kind} inputs (seed {args.seed}), schedule {args.schedule}", file=sys.stderr)
    start = time.time()
    result = run_attention(args.kernel, q8, k8, v8, qd, kd, vd, entry=entry, code_object=code,
                           schedule=args.schedule, seed=args.seed, progress=_progress)
    elapsed = time.time() - start
    model, model_lse = zyfa.numerics.attention(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd,
                                               config=zyfa.numerics.config_from_kernel(entry),
                                               return_lse=True)
    done = result.rows_done(entry["tile_m"])
    rows = done.permute(0, 2, 1)
    out, ref = result.out.float()[rows], model.float()[rows]
    rel = ((out - ref).norm() / ref.norm()).item()
    lse_err = (result.lse[done] - model_lse[done]).abs().max().item()
    print(f"  {result.stats.instructions} wave instructions ({result.stats.workgroups} workgroups, "
          f"{len(result.jobs)} jobs) in {elapsed:.1f} s; max |lse - model| = {lse_err:.3e}")
    print(LAST_LINE.format(rel))
    return 0


def _kernel_names() -> list[str]:
    import zyfa_kernels
    return sorted(k.name for k in zyfa_kernels.manifest().kernels if k.target == "gfx950")


def table(args) -> int:
    from .isa import table as instruction_table
    for name, unit, source in instruction_table():
        print(f"{name:40s} {unit:10s} {source}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m asmgen.sim", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run a committed gfx950 kernel and compare with the numerics model",
                       description="Simulate one causal FP8 attention call of a committed gfx950 code object on "
                                   "activation-like inputs; the last line printed is the relative error against "
                                   "zyfa.numerics.")
    r.add_argument("--kernel", required=True, choices=_kernel_names(),
                   help="a gfx950 kernel of the manifest, e.g. fp8_d128 (d=128, lean P), fp8_d192 (d_qk=192, "
                        "d_v=128, exact P), bf16_d128, bf16_d192 (HIP C++, BF16 inputs), fp8_d128_wide, "
                        "fp8_d192_wide (HIP C++, 64-bit offsets)")
    r.add_argument("--seqlen", type=int, default=512, help="sequence length, a multiple of 256 (default 512)")
    r.add_argument("--heads", type=int, default=2, help="query heads (default 2)")
    r.add_argument("--kv-heads", type=int, default=None, help="key/value heads, dividing --heads (default: MHA)")
    r.add_argument("--batch", type=int, default=1, help="batch size (default 1)")
    r.add_argument("--seed", type=int, default=0, help="seed of the inputs and of the wave schedule")
    r.add_argument("--inputs", choices=("activation", "gaussian"), default="activation",
                   help="activation-like (default) or unit Gaussian")
    r.add_argument("--schedule", choices=("round_robin", "greedy", "random"), default="round_robin",
                   help="interleaving of the 8 waves of a workgroup (greedy and random expose missing barriers)")
    r.set_defaults(func=run)
    t = sub.add_parser("table", help="list the implemented instructions with the source of their semantics")
    t.set_defaults(func=table)
    args = parser.parse_args(argv)
    if getattr(args, "kv_heads", 0) is None:
        args.kv_heads = args.heads
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
