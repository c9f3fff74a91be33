"""The flash-attn 2 compatible API: flash_attn_func and its packed and varlen variants.

Each function checks its arguments (checks.py), passes descale tensors on as they are (one element or (batch,
nheads_k), any strides), makes a float descale a cached one-element tensor on q's device, and calls
torch.ops.zyfa.fwd. Strided inputs go to the op as they are: a backend copies only what its
kernel cannot read (a last dimension that is not contiguous, a misaligned view) and pads the sequence only for
kernels that do not mask their last tile (the manifest's masks_tail).

Eagerly, plain tensors that need no autograd, outside torch.compile, tracing and dispatch modes, skip the
dispatcher's custom-op layers (about 15 us per call) and run the op's implementation directly: the same checks
and backend, the same results. Everything else goes through the op.
"""

from __future__ import annotations

import functools

import torch

from . import checks, op

PACK_DIM = {"bshd": 2, "bhsd": 1}  # packed qkv / kv: the pack dimension stands just before the heads


@functools.lru_cache(maxsize=64)
def _filled(value: float, device: torch.device) -> torch.Tensor:
    """A float descale as a one-element tensor, made once per value and device (never written; a normal tensor
    even when made under inference_mode)."""
    with torch.inference_mode(False):
        return torch.full((1,), value, dtype=torch.float32, device=device)


def _descale_tensor(value, device) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value  # one element or (batch, heads_k), any strides: the kernels read it where it is
    if torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack():  # traced or fake: nothing cached
        return torch.full((1,), value, dtype=torch.float32, device=device)
    return _filled(value, device)


def _direct(q, k, v) -> bool:
    """Whether the op's implementation may be called without the dispatcher (see the module docstring)."""
    if torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack() or torch._C._is_tracing():
        return False
    if not type(q) is type(k) is type(v) is torch.Tensor:
        return False
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return False
    return torch._C._functorch.peek_interpreter_stack() is None  # no vmap / grad transform


def _attention(q, k, v, softmax_scale, q_descale, k_descale, v_descale, layout, p_mode):
    """Checked call of the op; returns (out, lse)."""
    problem = checks.attention_inputs(q, k, v, layout)
    scale = checks.softmax_scale_value(softmax_scale, problem.d_qk)
    if p_mode is not None:
        p_mode = checks.p_mode_value(p_mode, problem)
    if problem.is_fp8 or not (q_descale is None and k_descale is None and v_descale is None):
        descales = checks.descales(problem, q.device, scale, q_descale=q_descale, k_descale=k_descale,
                                   v_descale=v_descale)
        checks.cpu_values(problem, q, k, *descales, scale)
        if problem.is_fp8:
            descales = tuple(_descale_tensor(d, q.device) for d in descales)
    else:  # BF16 without descales, the common call
        descales = (None, None, None)
        checks.cpu_values(problem, q, k, None, None, None, scale)
    if _direct(q, k, v):
        return op.forward(problem, q, k, v, *descales, scale, layout, p_mode)
    return op.fwd(q, k, v, *descales, scale, layout, p_mode)


def _results(out, lse, return_lse: bool, return_attn_probs: bool):
    if return_attn_probs:
        return out, lse.contiguous(), None  # flash-attn's (out, softmax_lse, S_dmask); no probabilities formed
    return (out, lse.contiguous()) if return_lse else out


def flash_attn_func(
    q,
    k,
    v,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    *,
    q_descale=None,
    k_descale=None,
    v_descale=None,
    layout="bshd",
    return_lse=False,
    p_mode=None,
):
    """Causal attention of q (batch, seqlen, nheads, d_qk) over k, v (batch, seqlen, nheads_k, d_qk / d_v).

    layout="bhsd" takes and returns (batch, heads, seqlen, dim) instead. BF16 inputs, or FP8 e4m3 inputs with
    q_descale, k_descale, v_descale (a float, a one-element float32 tensor, or float32 (batch, nheads_k)).
    Returns out (BF16, q's layout, d_v columns); with return_lse=True also the natural-log log-sum-exp of the
    scaled scores, float32 (batch, nheads, seqlen); return_attn_probs=True returns (out, lse, None).
    p_mode (FP8 only): how probabilities are rounded to FP8 before P V, "exact" (e4m3 of 2^y) or "lean" (the
    code read off the exponent); None takes the target's default from the kernel manifest (exact, except gfx950
    at d = 128: lean), and the CPU reference path the contract's (exact). A p_mode a target has no kernel for is
    a ValueError naming it.
    Numbers (softmax_scale, descales) may be Python, numpy or torch scalars; they must keep the scores and the
    output finite in FP32 (checks.py: q_descale * k_descale * softmax_scale * 448^2 * d_qk * log2(e) and
    448 * v_descale within range).
    ZYFA is always deterministic; causal must be True and dropout, softcap, ALiBi and windows are not supported.
    """
    checks.flash_attn_options(
        dropout_p=dropout_p, softmax_scale=softmax_scale, causal=causal, window_size=window_size,
        softcap=softcap, alibi_slopes=alibi_slopes,
    )
    out, lse = _attention(q, k, v, softmax_scale, q_descale, k_descale, v_descale, layout, p_mode)
    return _results(out, lse, return_lse, return_attn_probs)


def _unpack(name: str, packed, count: int, layout) -> tuple[torch.Tensor, ...]:
    if not isinstance(packed, torch.Tensor):
        raise checks.type_error(f"{name} must be a torch.Tensor, got {type(packed).__name__}")
    if layout not in PACK_DIM:
        raise checks.value_error(f"layout={layout!r}: must be 'bshd' (batch, seqlen, heads, dim) or 'bhsd'")
    dim = PACK_DIM[layout]
    expected = "(batch, seqlen, {n}, heads, dim)" if layout == "bshd" else "(batch, {n}, heads, seqlen, dim)"
    if packed.dim() != 5 or packed.shape[dim] != count:
        raise checks.value_error(f"{name} has shape {tuple(packed.shape)}, expected {expected.format(n=count)}")
    return packed.unbind(dim)


def flash_attn_qkvpacked_func(
    qkv,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    *,
    q_descale=None,
    k_descale=None,
    v_descale=None,
    layout="bshd",
    return_lse=False,
    p_mode=None,
):
    """flash_attn_func on qkv (batch, seqlen, 3, nheads, d) (layout="bhsd": (batch, 3, nheads, seqlen, d))."""
    checks.flash_attn_options(
        dropout_p=dropout_p, softmax_scale=softmax_scale, causal=causal, window_size=window_size,
        softcap=softcap, alibi_slopes=alibi_slopes,
    )
    q, k, v = _unpack("qkv", qkv, 3, layout)
    out, lse = _attention(q, k, v, softmax_scale, q_descale, k_descale, v_descale, layout, p_mode)
    return _results(out, lse, return_lse, return_attn_probs)


def flash_attn_kvpacked_func(
    q,
    kv,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    *,
    q_descale=None,
    k_descale=None,
    v_descale=None,
    layout="bshd",
    return_lse=False,
    p_mode=None,
):
    """flash_attn_func on q and kv (batch, seqlen, 2, nheads_k, d) (layout="bhsd": (batch, 2, nheads_k, seqlen, d))."""
    checks.flash_attn_options(
        dropout_p=dropout_p, softmax_scale=softmax_scale, causal=causal, window_size=window_size,
        softcap=softcap, alibi_slopes=alibi_slopes,
    )
    k, v = _unpack("kv", kv, 2, layout)
    out, lse = _attention(q, k, v, softmax_scale, q_descale, k_descale, v_descale, layout, p_mode)
    return _results(out, lse, return_lse, return_attn_probs)


def flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    block_table=None,
    *,
    q_descale=None,
    k_descale=None,
    v_descale=None,
    return_lse=False,
    p_mode=None,
):
    """flash_attn_func on sequences packed along the first dimension: q (total, nheads, d_qk), k, v likewise.

    Only batches of equal lengths are supported (cu_seqlens = 0, L, 2L, ... with L = max_seqlen). cu_seqlens are
    1-D int32 tensors on q's device; on the CPU their values are checked, on a GPU only total == batch * L is
    (reading device memory would wait for the GPU). Returns out (total, nheads, d_v) and, if asked, lse as
    flash-attn's varlen lse: float32 (nheads, total).
    """
    checks.flash_attn_options(
        dropout_p=dropout_p, softmax_scale=softmax_scale, causal=causal, window_size=window_size,
        softcap=softcap, alibi_slopes=alibi_slopes,
    )
    if block_table is not None:
        raise checks.value_error("block_table: ZYFA has no paged KV cache, block_table must be None")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise checks.type_error(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 3:
            raise checks.value_error(f"{name} has {t.dim()} dimensions, expected 3 (total, heads, dim) for varlen")
    max_seqlen_q = checks.int_value("max_seqlen_q", max_seqlen_q)
    max_seqlen_k = checks.int_value("max_seqlen_k", max_seqlen_k)
    if max_seqlen_q != max_seqlen_k:
        raise checks.value_error(f"max_seqlen_q={max_seqlen_q}, max_seqlen_k={max_seqlen_k}: ZYFA needs "
                                 "seqlen_q == seqlen_k")
    batch = checks.varlen_batch("cu_seqlens_q", cu_seqlens_q, max_seqlen_q, q.shape[0], q.device)
    batch_k = checks.varlen_batch("cu_seqlens_k", cu_seqlens_k, max_seqlen_k, k.shape[0], q.device)
    if batch_k != batch:
        raise checks.value_error(f"cu_seqlens_q holds {batch} sequences but cu_seqlens_k {batch_k}: they must be equal")
    if v.shape[0] != k.shape[0]:
        raise checks.value_error(f"k holds {k.shape[0]} tokens but v {v.shape[0]}: they must be equal")
    q4, k4, v4 = (t.reshape(batch, max_seqlen_q, t.shape[1], t.shape[2]) for t in (q, k, v))
    out, lse = _attention(q4, k4, v4, softmax_scale, q_descale, k_descale, v_descale, "bshd", p_mode)
    out = out.reshape(q.shape[0], out.shape[2], out.shape[3])
    if return_lse or return_attn_probs:
        lse = lse.transpose(0, 1).reshape(lse.shape[1], q.shape[0])
    return _results(out, lse, return_lse, return_attn_probs)
