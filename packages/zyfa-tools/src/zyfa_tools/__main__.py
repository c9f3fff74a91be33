"""python -m zyfa_tools calibrate | capture | evaluate: FP8 attention tools for transformers models.

Every command takes a model: a local path or hub id of weights you have (loaded with from_pretrained in BF16),
or random:llama, random:mistral, random:qwen2 for a small randomly initialised model (nothing downloaded). Inputs
are token ids: from --text FILE (tokenized with the model's tokenizer) or random ids (--data-seed). Progress
goes to stderr, results to stdout.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

EPILOG = """\
examples:
  python -m zyfa_tools evaluate --model random:llama --key-bias 30
      KL of next-token distributions and per-layer errors, with and without rotation and K smoothing
  python -m zyfa_tools calibrate --model MODEL_DIR --text calib.txt --out scales.safetensors
      static FP8 scales per layer (then: zyfa_tools.hf.configure(model, scales="scales.safetensors"))
  python -m zyfa_tools evaluate --model MODEL_DIR --text eval.txt --scales scales.safetensors --plot e.png
  python -m zyfa_tools capture --model random:qwen2 --seqlen 512 --out qkv.safetensors

The FP8 recipe: q and k rotated after RoPE by a random Hadamard matrix (d_qk = 128) or a DCT x Hadamard one
(d_qk = 192), k smoothed (each KV head's mean key subtracted), q, k, v quantized to e4m3 with one power-of-two
scale per (batch, KV head), from each call's amax or from static calibrated scales. On the CPU, ZYFA runs its
reference model: keep models and sequences small there (the random models run in seconds).
"""


def _model_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("model and data")
    g.add_argument("--model", default="random:llama",
                   help="local path or hub id (from_pretrained), or random:llama|random:mistral|random:qwen2")
    g.add_argument("--key-bias", type=float, default=0.0,
                   help="random models: a constant key offset of this size on a few channels per head (as real "
                        "models' K outliers; 0 = plain random weights)")
    g.add_argument("--layers", type=int, default=2, help="random models: number of layers")
    g.add_argument("--heads", type=int, default=4, help="random models: query heads (head_dim 128)")
    g.add_argument("--kv-heads", type=int, default=2, help="random models: KV heads")
    g.add_argument("--hidden", type=int, default=256, help="random models: hidden size (the MLP's is twice that)")
    g.add_argument("--vocab", type=int, default=512, help="random models: vocabulary size")
    g.add_argument("--seed", type=int, default=0, help="random models: weight seed")
    g.add_argument("--text", metavar="FILE", help="text to tokenize with the model's tokenizer (else random ids)")
    g.add_argument("--seqlen", type=int, default=256, help="tokens per sequence")
    g.add_argument("--batches", type=int, default=1, help="sequences (one forward each)")
    g.add_argument("--data-seed", type=int, default=0, help="seed of the random token ids")
    g.add_argument("--device", default="cpu", help="torch device of the model (cuda: the ZYFA kernels)")


def _recipe_args(parser: argparse.ArgumentParser, title: str = "FP8 recipe") -> None:
    g = parser.add_argument_group(title)
    g.add_argument("--no-rotation", dest="rotation", action="store_false", help="do not rotate q and k")
    g.add_argument("--no-smoothing", dest="smoothing", action="store_false", help="do not subtract the key mean")
    g.add_argument("--rotation-seed", type=int, default=0, help="seed of the rotation's random signs")


def _model(args):
    from . import hf, models

    hf.register()
    if args.model.startswith("random:"):
        model = models.random_model(args.model.split(":", 1)[1], layers=args.layers, heads=args.heads,
                                    kv_heads=args.kv_heads, hidden=args.hidden, vocab=args.vocab, seed=args.seed,
                                    key_bias=args.key_bias, max_positions=max(4096, args.seqlen))
    else:
        model = models.load_model(args.model)
    return model.to(args.device)


def _batches(args, model, offset: int = 0) -> list[torch.Tensor]:
    """`args.batches` sequences of `args.seqlen` token ids; offset shifts to data unseen by another command."""
    n, s = args.batches, args.seqlen
    if args.text:
        from transformers import AutoTokenizer

        with open(args.text, encoding="utf-8") as f:
            ids = AutoTokenizer.from_pretrained(args.model)(f.read(), return_tensors="pt").input_ids[0]
        first = offset * n * s
        if ids.numel() < first + n * s:
            raise SystemExit(f"--text {args.text}: {ids.numel()} tokens, {first + n * s} needed for {n} x {s}")
        return [ids[first + i * s:first + (i + 1) * s][None].to(args.device) for i in range(n)]
    gen = torch.Generator().manual_seed(args.data_seed + 1000 * offset)
    vocab = model.config.vocab_size
    return [torch.randint(0, vocab, (1, s), generator=gen).to(args.device) for _ in range(n)]


def _recipe(args):
    from .quantize import Recipe

    return Recipe(args.rotation, args.smoothing, args.rotation_seed)


def calibrate_command(args) -> int:
    from .calibration import calibrate

    model = _model(args)
    scales = calibrate(model, _batches(args, model), _recipe(args))
    scales.save(args.out)
    print(f"{args.out}: static scales of {len(scales.layers)} layers ({scales.recipe.describe()}, seed "
          f"{scales.recipe.seed}) from {args.batches} x {args.seqlen} tokens")
    for i, s in scales.layers.items():
        print(f"layer {i}: amax q {s.q_amax.max():.3g}  k {s.k_amax.max():.3g}  v {s.v_amax.max():.3g}  "
              f"|k mean| {s.k_mean.norm(dim=-1).max():.3g}")
    return 0


def capture_command(args) -> int:
    from . import capture

    model = _model(args)
    layers = set(args.layer) if args.layer else None
    tensors, scale = capture.capture(model, _batches(args, model)[0], layers)
    capture.save(args.out, tensors, scale)
    print(f"{args.out}: {len(tensors) // 3} layers of post-RoPE q, k, v (softmax_scale {scale:.6g})")
    for key, t in tensors.items():
        print(f"  {key}: {tuple(t.shape)} {t.dtype}")
    return 0


def _table(rows) -> str:
    layers = sorted(rows[0]["layer_errors"])
    head = f"{'variant':32s} {'KL (nats)':>10s} {'top-1':>7s} " + " ".join(f"{'L' + str(i):>7s}" for i in layers)
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['variant']:32s} {r['kl']:10.3e} {r['top1_agreement']:7.1%} "
                     + " ".join(f"{r['layer_errors'][i]:7.4f}" for i in layers))
    return "\n".join(lines)


def plot(rows, path: str) -> None:
    """Per-layer relative RMS errors of every variant as grouped bars (log scale), KL in the legend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers = sorted(rows[0]["layer_errors"])
    width = 0.8 / len(rows)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(layers) + 3), 4.5))
    for j, r in enumerate(rows):
        ax.bar([i + (j - (len(rows) - 1) / 2) * width for i in range(len(layers))],
               [r["layer_errors"][layer] for layer in layers], width, label=f"{r['variant']} (KL {r['kl']:.2e})")
    ax.set_xticks(range(len(layers)), [str(layer) for layer in layers])
    ax.set_yscale("log")
    ax.set_xlabel("layer")
    ax.set_ylabel("relative RMS error of the attention output")
    ax.set_title("ZYFA attention against float64 attention on the BF16 model's q, k, v")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def _versions() -> dict:
    from importlib import metadata

    found = {}
    for name in ("torch", "transformers", "zyfa-torch", "zyfa-tools"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def evaluate_command(args) -> int:
    from . import evaluate
    from .calibration import StaticScales, calibrate

    model = _model(args)
    recipe = _recipe(args)
    variants = list(evaluate.VARIANTS)
    scales = None
    if args.scales:
        scales = StaticScales.load(args.scales)
    elif args.calibrate:
        scales = calibrate(model, _batches(args, model, offset=1), recipe)  # other data than evaluated
    if scales is not None:
        variants.append(evaluate.Variant(f"fp8 {scales.recipe.describe()} static", recipe=scales.recipe,
                                         static=True))
    rows = []
    for input_ids in _batches(args, model):
        rows.append(evaluate.model_report(model, input_ids, variants, scales, compile=False if args.eager else None))
    merged = [{"variant": r[0]["variant"], "kl": sum(x["kl"] for x in r) / len(r),
               "top1_agreement": sum(x["top1_agreement"] for x in r) / len(r),
               "layer_errors": {i: sum(x["layer_errors"][i] for x in r) / len(r) for i in r[0]["layer_errors"]}}
              for r in zip(*rows, strict=True)]
    print(f"{args.model}: {args.batches} x {args.seqlen} tokens on {args.device}; KL of next-token distributions "
          f"from the model's own attention; per layer (L<i>) the relative RMS error of the attention output")
    print(_table(merged))
    arguments = {k: v for k, v in vars(args).items() if k != "run"}
    result = {"model": args.model, "arguments": arguments, "versions": _versions(),
              "device": torch.cuda.get_device_name() if str(args.device).startswith("cuda") else "cpu",
              "rows": merged}
    if args.functional:
        result["functional"] = {}
        for d_qk in (128, 192):
            f_rows = evaluate.functional_report(d_qk, 128, seqlen=args.seqlen)
            result["functional"][d_qk] = f_rows
            print(f"functional API, activation-like inputs, d_qk={d_qk}, d_v=128, S={args.seqlen}: "
                  + ", ".join(f"{r['variant']} {r['error']:.4f}" for r in f_rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    if args.plot:
        plot(merged, args.plot)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zyfa_tools", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG)
    sub = parser.add_subparsers(dest="command", required=True, metavar="{calibrate,capture,evaluate}")
    p = sub.add_parser("calibrate", help="static FP8 scales per layer, saved as safetensors",
                       description="Run the model on calibration data and save per-layer static FP8 scales (amax "
                                   "of rotated q, of rotated and smoothed k, of v, per KV head) and key means.",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG)
    _model_args(p)
    _recipe_args(p)
    p.add_argument("--out", required=True, metavar="FILE", help="the scales file to write (.safetensors)")
    p.set_defaults(run=calibrate_command)
    p = sub.add_parser("capture", help="post-RoPE q, k, v of every layer to safetensors",
                       description="Run the model on one sequence and write each layer's post-RoPE q, k, v "
                                   "(batch, seqlen, heads, d) to a safetensors file.",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG)
    _model_args(p)
    p.add_argument("--layer", type=int, action="append", help="capture only this layer (repeatable)")
    p.add_argument("--out", required=True, metavar="FILE", help="the capture file to write (.safetensors)")
    p.set_defaults(run=capture_command)
    p = sub.add_parser("evaluate", help="KL and per-layer errors of FP8 attention, with and without rotation and "
                                        "smoothing",
                       description="Compare the model with ZYFA attention (BF16; FP8 plain, with rotation, with K "
                                   "smoothing, with both; static scales if given) to the model with its own BF16 "
                                   "attention: KL divergence of next-token distributions, top-1 agreement, and "
                                   "each layer's relative RMS error of the attention output.",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EPILOG)
    _model_args(p)
    _recipe_args(p, "FP8 recipe of --calibrate (the other variants are fixed: see above)")
    p.add_argument("--scales", metavar="FILE", help="also evaluate these static scales (python -m zyfa_tools "
                                                     "calibrate)")
    p.add_argument("--calibrate", action="store_true",
                   help="also evaluate static scales calibrated here on other (random or later) tokens")
    p.add_argument("--functional", action="store_true",
                   help="also the functional API on activation-like inputs at d_qk = 128 and 192 (d_v = 128)")
    p.add_argument("--eager", action="store_true",
                   help="prepare q, k, v without torch.compile on the GPU (the same FP8 codes but for a rare last "
                        "bit of the rotation's sums; saves the compile time of each recipe)")
    p.add_argument("--json", metavar="FILE", help="write the results as JSON")
    p.add_argument("--plot", metavar="FILE", help="draw the per-layer errors (PNG, needs matplotlib)")
    p.set_defaults(run=evaluate_command)
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
