"""ZYFA attention for Hugging Face transformers models (pip install zyfa-tools[hf]).

    import zyfa_tools.hf
    zyfa_tools.hf.register()
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="zyfa-fp8", dtype=torch.bfloat16)
    zyfa_tools.hf.configure(model, rotation=True, smoothing=True, scales="scales.safetensors")  # optional

`register()` adds two implementations to transformers' AttentionInterface (and, for their masks, the sdpa mask
builder to the AttentionMaskInterface): "zyfa" runs ZYFA's BF16 attention, "zyfa-fp8" its FP8 attention on
q and k rotated after RoPE, k smoothed, and q, k, v quantized with per-call or static scales (each switchable
with `configure`; default: rotation and smoothing on, per-call scales). Any Llama-, Mistral- or Qwen-style model
whose attention calls `ALL_ATTENTION_FUNCTIONS` works with attn_implementation="zyfa-fp8" at load time or with
`model.config._attn_implementation = "zyfa-fp8"` later.

ZYFA runs a call when it is causal prefill: no attention mask (the sdpa mask builder passes None for causal
attention without padding), as many keys as queries (no cached prefix), is_causal, no dropout, softcap,
attention sinks or sliding window shorter than the sequence (a sequence that reaches the window gets a mask).
Every other call - padding masks, decoding and chunked prefill with a KV cache, packed sequences, non-causal
attention - runs the model's sdpa implementation instead (configure(..., fallback="raise") raises a ValueError
naming the reason). Head dimensions ZYFA lacks (it has d_qk = d_v = 128 and d_qk = 192, d_v = 128) raise a
ValueError on the first call. Inputs of another dtype than BF16 (a float32 model) are rounded to BF16 and the
output is returned in the model's dtype. `counts` tells how many calls ran each way.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass

import torch

from zyfa import flash_attn_func
from zyfa.backends import dispatch

from .calibration import StaticScales
from .quantize import Recipe, fp8_attention

BF16_NAME, FP8_NAME, OBSERVE_NAME = "zyfa", "zyfa-fp8", "zyfa-observe"
FALLBACKS = ("sdpa", "raise")
counts: Counter = Counter()  # "zyfa", "zyfa-fp8", "sdpa: <reason>": calls since import (or counts.clear())


@dataclass(frozen=True)
class Options:
    """The FP8 recipe of one model, its static scales (None: per call), what unsupported calls do, and whether
    the preparation of q, k, v runs under torch.compile (None: on CUDA devices)."""

    recipe: Recipe = Recipe()
    scales: StaticScales | None = None
    fallback: str = "sdpa"
    compile: bool | None = None


DEFAULT = Options()
ATTRIBUTE = "zyfa_options"  # set on the attention modules by configure()


def _why_not(module, query, key, attention_mask, dropout, is_causal, kwargs) -> str | None:
    """None if the call is causal prefill ZYFA computes, else the reason it is not."""
    if attention_mask is not None:
        return "attention mask (padding, packed sequences or a masked cache)"
    if query.shape[2] != key.shape[2]:
        return f"{query.shape[2]} queries over {key.shape[2]} keys (decoding or chunked prefill with a KV cache)"
    if is_causal is False or not getattr(module, "is_causal", True):
        return "non-causal attention"
    if dropout:
        return f"dropout {dropout}"
    if kwargs.get("softcap") is not None:
        return "logit softcap"
    if kwargs.get("s_aux") is not None:
        return "attention sinks"
    window = kwargs.get("sliding_window")
    if window is not None and window < key.shape[2]:
        return f"sliding window {window} < {key.shape[2]} keys"
    return None


def _check_head_dims(query, value) -> None:
    dims = (query.shape[-1], value.shape[-1])
    if dims not in dispatch.head_dims():
        raise ValueError(
            f"ZYFA attention: this model has head dims d_qk={dims[0]}, d_v={dims[1]}; ZYFA supports "
            f"{dispatch.describe_head_dims()}: load it with attn_implementation='sdpa'"
        )


def _sdpa(*args, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(*args, **kwargs)


def _attention(name, module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None,
               **kwargs):
    """The AttentionInterface function: query (batch, heads, seqlen, d), key and value (batch, heads_k, ...)."""
    options = getattr(module, ATTRIBUTE, DEFAULT)
    _check_head_dims(query, value)
    reason = _why_not(module, query, key, attention_mask, dropout, is_causal, kwargs)
    if reason is not None:
        if options.fallback == "raise":
            raise ValueError(f"{name} attention cannot run this call: {reason}; use configure(fallback='sdpa')")
        counts[f"sdpa: {reason}"] += 1
        return _sdpa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                     is_causal=is_causal, **kwargs)
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))  # (batch, seqlen, heads, d) views
    if name == BF16_NAME:
        out = flash_attn_func(*(t.to(torch.bfloat16) for t in (q, k, v)), softmax_scale=scaling, causal=True)
    else:
        layer_scales = options.scales[module.layer_idx] if options.scales is not None else None
        out = fp8_attention(q, k, v, options.recipe, softmax_scale=scaling, layer_scales=layer_scales,
                            compile=options.compile)
    counts[name] += 1
    return out.to(query.dtype), None


def zyfa_attention_forward(module, query, key, value, attention_mask, **kwargs):
    """ZYFA BF16 attention ("zyfa")."""
    return _attention(BF16_NAME, module, query, key, value, attention_mask, **kwargs)


def zyfa_fp8_attention_forward(module, query, key, value, attention_mask, **kwargs):
    """ZYFA FP8 attention ("zyfa-fp8") with the module's Options (see configure)."""
    return _attention(FP8_NAME, module, query, key, value, attention_mask, **kwargs)


_observers: list = []  # the callbacks of the active observe() blocks, innermost last


def _observing_attention(module, query, key, value, attention_mask, **kwargs):
    out, weights = _sdpa(module, query, key, value, attention_mask, **kwargs)
    scale = kwargs.get("scaling")
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    _observers[-1](module.layer_idx, *(t.transpose(1, 2) for t in (query, key, value)), out, scale)
    return out, weights


def register() -> None:
    """Register "zyfa" and "zyfa-fp8" (and "zyfa-observe", used by observe) with transformers; idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    for name, fn in ((BF16_NAME, zyfa_attention_forward), (FP8_NAME, zyfa_fp8_attention_forward),
                     (OBSERVE_NAME, _observing_attention)):
        AttentionInterface.register(name, fn)
        AttentionMaskInterface.register(name, sdpa_mask)


def attention_modules(model) -> list[torch.nn.Module]:
    """The modules that call the attention interface: those with a layer_idx and q/k/v projections or a config."""
    found = [m for m in model.modules() if hasattr(m, "layer_idx") and hasattr(m, "config")
             and hasattr(m, "head_dim")]
    if not found:
        raise ValueError(f"{type(model).__name__} has no attention modules with layer_idx and head_dim: ZYFA's "
                         "integration supports Llama-, Mistral- and Qwen-style transformers models")
    return found


def configure(model, *, rotation: bool = True, smoothing: bool = True, scales=None, seed: int = 0,
              fallback: str = "sdpa", compile: bool | None = None):
    """Set the FP8 options of `model`'s attention layers; returns the model.

    scales: None (per-call amax), a StaticScales or the path of a scales file (python -m zyfa_tools calibrate),
    calibrated with the same rotation, smoothing and seed. fallback: "sdpa" (calls ZYFA cannot run go to the
    model's sdpa attention) or "raise". compile: prepare q, k, v under torch.compile (None: on CUDA devices;
    False: eager, the same FP8 codes but for a rare last-bit difference of the rotation's sums, no compile time).
    """
    if fallback not in FALLBACKS:
        raise ValueError(f"fallback={fallback!r}: must be one of {FALLBACKS}")
    recipe = Recipe(rotation, smoothing, seed)
    if scales is not None and not isinstance(scales, StaticScales):
        scales = StaticScales.load(scales)
    if scales is not None and scales.recipe != recipe:
        raise ValueError(f"the static scales were calibrated with {scales.recipe}, configure asks for {recipe}")
    options = Options(recipe, scales, fallback, compile)
    for m in attention_modules(model):
        setattr(m, ATTRIBUTE, options)
    return model


@contextlib.contextmanager
def use(model, implementation: str):
    """Run `model` with another attention implementation inside the block (restored afterwards)."""
    register()
    config = model.config
    previous = config._attn_implementation
    config._attn_implementation = implementation
    try:
        yield model
    finally:
        config._attn_implementation = previous


@contextlib.contextmanager
def observe(model, callback):
    """Inside the block, every attention call of `model` runs the model's BF16 attention (sdpa, whatever the
    model's implementation is) and then calls callback(layer, q, k, v, out, softmax_scale) with the post-RoPE
    q, k, v and the output, all (batch, seqlen, heads, d)."""
    register()
    _observers.append(callback)
    try:
        with use(model, OBSERVE_NAME):
            yield
    finally:
        _observers.pop()
