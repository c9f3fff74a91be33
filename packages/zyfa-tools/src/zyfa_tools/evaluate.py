"""How much FP8 attention changes a model: KL divergence of next-token distributions and per-layer errors.

- `kl_divergence(ref_logits, logits)`: mean over positions of KL(p_ref || p) in nats, p = softmax(logits).
- `model_report(model, input_ids, variants)`: for each variant (ZYFA BF16, or FP8 with or without rotation and
  K smoothing, per-call or static scales), the KL of the whole model with that attention from the model with its
  own BF16 attention (sdpa), the top-1 agreement, and per layer the relative RMS error of the attention output
  against float64 attention on the very q, k, v the BF16 model computes at that layer (so a layer's error is its
  own, not what earlier layers passed on).
- `functional_report(d_qk, d_v)`: the same per-variant errors through the functional API
  (zyfa_tools.quantize.fp8_attention) on activation-like inputs, e.g. d_qk = 192, d_v = 128, with no model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import inputs
from .progress import progress
from .quantize import Recipe, fp8_attention
from .reference import attention_fp64, relative_rms_error


@dataclass(frozen=True)
class Variant:
    """One attention configuration: "zyfa" (BF16) or "zyfa-fp8" with a recipe and static scales or not."""

    name: str
    implementation: str = "zyfa-fp8"
    recipe: Recipe = Recipe()
    static: bool = False


VARIANTS = (
    Variant("zyfa bf16", "zyfa"),
    Variant("fp8 plain", recipe=Recipe(rotation=False, smoothing=False)),
    Variant("fp8 rotation", recipe=Recipe(rotation=True, smoothing=False)),
    Variant("fp8 smoothing", recipe=Recipe(rotation=False, smoothing=True)),
    Variant("fp8 rotation + smoothing", recipe=Recipe(rotation=True, smoothing=True)),
)


def kl_divergence(ref_logits: torch.Tensor, logits: torch.Tensor) -> float:
    """Mean over all positions of KL(softmax(ref_logits) || softmax(logits)), in nats, computed in float64."""
    if ref_logits.shape != logits.shape:
        raise ValueError(f"logits have shapes {tuple(ref_logits.shape)} and {tuple(logits.shape)}: must be equal")
    lp = ref_logits.double().log_softmax(-1)
    lq = logits.double().log_softmax(-1)
    return (lp.exp() * (lp - lq)).sum(-1).mean().item()


def _layer_output(variant: Variant, q, k, v, scale, layer_scales=None, compile=None) -> torch.Tensor:
    from zyfa import flash_attn_func

    if variant.implementation == "zyfa":
        return flash_attn_func(q.bfloat16(), k.bfloat16(), v.bfloat16(), softmax_scale=scale, causal=True)
    return fp8_attention(q, k, v, variant.recipe, softmax_scale=scale, layer_scales=layer_scales, compile=compile)


def layer_errors(model, input_ids, variants=VARIANTS, scales=None, compile=None) -> dict[str, dict[int, float]]:
    """Per variant and layer: relative RMS error of the attention output against float64 attention on the
    post-RoPE q, k, v of the model's own BF16 attention. Variants with static=True use `scales`; compile: as
    zyfa_tools.quantize.prepare's."""
    from . import hf

    errors: dict[str, dict[int, float]] = {v.name: {} for v in variants}

    def probe(layer, q, k, v, out, scale):
        ref = attention_fp64(q, k, v, softmax_scale=scale)
        for variant in variants:
            layer_scales = scales[layer] if variant.static else None
            out = _layer_output(variant, q, k, v, scale, layer_scales, compile)
            errors[variant.name][layer] = relative_rms_error(out, ref)

    with torch.no_grad(), hf.observe(model, probe):
        model(input_ids)
    return errors


def model_report(model, input_ids, variants=VARIANTS, scales=None, compile=None) -> list[dict]:
    """KL from the model's own attention, top-1 agreement and per-layer errors for each variant (compile: whether
    q, k, v are prepared under torch.compile, None: on CUDA devices)."""
    from . import hf

    with torch.no_grad(), hf.use(model, "sdpa"):
        ref = model(input_ids).logits
    errors = layer_errors(model, input_ids, variants, scales, compile)
    rows = []
    for variant in progress(variants, "variants", len(variants)):
        if variant.implementation == "zyfa-fp8":
            hf.configure(model, rotation=variant.recipe.rotation, smoothing=variant.recipe.smoothing,
                         seed=variant.recipe.seed, scales=scales if variant.static else None, fallback="raise",
                         compile=compile)
        with torch.no_grad(), hf.use(model, variant.implementation):
            logits = model(input_ids).logits
        rows.append({
            "variant": variant.name, "kl": kl_divergence(ref, logits),
            "top1_agreement": (ref.argmax(-1) == logits.argmax(-1)).double().mean().item(),
            "layer_errors": errors[variant.name],
        })
    hf.configure(model)  # back to the default options
    return rows


def functional_report(d_qk: int = 192, d_v: int = 128, *, seqlen: int = 512, heads: int = 4, heads_k: int = 2,
                      seed: int = 0, variants=VARIANTS[1:]) -> list[dict]:
    """Errors of FP8 variants through the functional API on activation-like inputs (BF16-rounded), against
    float64 attention on the same BF16 inputs; also the BF16 call's error for scale."""
    from zyfa import flash_attn_func

    q, k, v = (t.bfloat16() for t in inputs.activation_like(1, seqlen, heads, heads_k, d_qk, d_v, seed=seed))
    ref = attention_fp64(q, k, v)
    rows = [{"variant": "zyfa bf16", "error": relative_rms_error(flash_attn_func(q, k, v, causal=True), ref)}]
    for variant in progress(variants, f"d_qk={d_qk}", len(variants)):
        rows.append({"variant": variant.name, "error": relative_rms_error(fp8_attention(q, k, v, variant.recipe),
                                                                         ref)})
    return rows
