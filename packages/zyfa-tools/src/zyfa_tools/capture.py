"""Capture post-RoPE q, k, v of every attention layer of a transformers model into a safetensors file.

The tensors are those the model's attention receives (through zyfa_tools.hf.observe, which runs the model's
BF16 sdpa attention: after RoPE and, for GQA, before any repetition of KV heads), stored as layers.<i>.{q,k,v}
in (batch, seqlen, heads, d) layout in the model's dtype, with metadata {"format": "zyfa-qkv", "layout": "bshd",
"softmax_scale": "<float>"}. They feed zyfa_tools.evaluate or any study of FP8 attention on real activations
without running the model again.
"""

from __future__ import annotations

import torch

from . import hf

FORMAT = "zyfa-qkv"


def capture(model, input_ids: torch.Tensor, layers=None) -> tuple[dict[str, torch.Tensor], float]:
    """Run `model` on input_ids; returns ({"layers.<i>.q": ..., ...} on the CPU, softmax_scale)."""
    tensors: dict[str, torch.Tensor] = {}
    scales = set()

    def record(layer, q, k, v, out, scale):
        if layers is None or layer in layers:
            for name, t in (("q", q), ("k", k), ("v", v)):
                tensors[f"layers.{layer}.{name}"] = t.detach().cpu().contiguous()
            scales.add(float(scale))

    with torch.no_grad(), hf.observe(model, record):
        model(input_ids)
    if not tensors:
        raise ValueError(f"no attention layer matched layers={layers}")
    if len(scales) != 1:
        raise ValueError(f"the layers use different softmax scales {sorted(scales)}: capture them one at a time")
    return tensors, scales.pop()


def save(path, tensors: dict[str, torch.Tensor], softmax_scale: float) -> None:
    from safetensors.torch import save_file

    save_file(tensors, str(path), metadata={"format": FORMAT, "layout": "bshd", "softmax_scale": repr(softmax_scale)})


def load(path) -> tuple[dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]], float]:
    """({layer: (q, k, v)}, softmax_scale) from a file written by save."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        if meta.get("format") != FORMAT:
            raise ValueError(f"{path}: not a ZYFA capture (metadata format={meta.get('format')!r}, expected "
                             f"{FORMAT!r}): write one with python -m zyfa_tools capture")
        tensors = {key: f.get_tensor(key) for key in f.keys()}
    layers = sorted({int(key.split(".")[1]) for key in tensors})
    return {i: tuple(tensors[f"layers.{i}.{n}"] for n in "qkv") for i in layers}, float(meta["softmax_scale"])
