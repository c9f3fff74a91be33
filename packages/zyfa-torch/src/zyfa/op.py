"""The custom op torch.ops.zyfa.fwd: one attention forward on checked inputs.

It always returns (out, lse); the public API drops lse unless asked. The fake implementation lets
torch.compile trace through the op. ZYFA is forward-only: the registered backward is a second op whose fake
implementation keeps graphs traceable and whose real implementation raises, so that inputs requiring grad run
forward (eagerly and compiled) and only an actual backward call fails. `forward` is the op's implementation
after its checks, which the public API calls directly where the dispatcher adds nothing (interface.py).
"""

from __future__ import annotations

import torch

from . import backends, checks

FORWARD_ONLY = (
    "ZYFA is forward-only (inference prefill): it has no backward. Run it under torch.no_grad() or "
    "torch.inference_mode(), or detach the inputs"
)


def forward(problem, q, k, v, q_descale, k_descale, v_descale, softmax_scale, layout, p_mode):
    """The op's work on inputs that passed checks.op_inputs (or the API's stronger checks)."""
    return backends.select(q.device).forward(q, k, v, q_descale, k_descale, v_descale, softmax_scale, layout, p_mode)


@torch.library.custom_op("zyfa::fwd", mutates_args=())
def fwd(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    q_descale: torch.Tensor | None,
    k_descale: torch.Tensor | None,
    v_descale: torch.Tensor | None,
    softmax_scale: float,
    layout: str,
    p_mode: str | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention on q, k, v in `layout` (any sequence length, any strides); descales float32 tensors of one
    element or of shape (batch, nheads_k), any strides, for FP8, None for BF16; p_mode None (the target's default),
    "exact" or "lean" (FP8 only).
    Returns out (BF16, contiguous in q's layout) and lse (float32 (batch, heads, seqlen), contiguous)."""
    problem = checks.op_inputs(q, k, v, q_descale, k_descale, v_descale, softmax_scale, layout, p_mode)
    return forward(problem, q, k, v, q_descale, k_descale, v_descale, softmax_scale, layout, p_mode)


@fwd.register_fake
def _fwd_fake(q, k, v, q_descale, k_descale, v_descale, softmax_scale, layout, p_mode):
    p = checks.op_inputs(q, k, v, q_descale, k_descale, v_descale, softmax_scale, layout, p_mode)
    out_shape = (p.batch, p.seqlen, p.heads, p.d_v) if layout == "bshd" else (p.batch, p.heads, p.seqlen, p.d_v)
    out = q.new_empty(out_shape, dtype=torch.bfloat16)
    lse = q.new_empty((p.batch, p.heads, p.seqlen), dtype=torch.float32)
    return out, lse


@torch.library.custom_op("zyfa::fwd_backward", mutates_args=())
def fwd_backward(
    grad_out: torch.Tensor | None, grad_lse: torch.Tensor | None, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    raise NotImplementedError(FORWARD_ONLY)


@fwd_backward.register_fake
def _fwd_backward_fake(grad_out, grad_lse, q, k, v):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v = inputs[:3]
    ctx.save_for_backward(q, k, v)


def _backward(ctx, grad_out, grad_lse):
    # Taking the incoming gradients keeps this op in the backward graph when torch.compile partitions it.
    dq, dk, dv = fwd_backward(grad_out, grad_lse, *ctx.saved_tensors)
    return dq, dk, dv, None, None, None, None, None, None


fwd.register_autograd(_backward, setup_context=_setup_context)
