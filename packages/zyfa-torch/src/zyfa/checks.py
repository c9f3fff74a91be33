"""Argument checks of the public API and of the custom op, with errors that name the argument and the rule.

Every check here reads shapes, dtypes and devices only: nothing reads tensor data on the host, so the checks
never wait for the GPU and trace cleanly under torch.compile.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch

SEQLEN_ALIGN = 256  # the backends take seqlen padded to a multiple of the largest query tile (gfx950's 256 rows)
HEAD_DIMS = ((128, 128), (192, 128))  # supported (d_qk, d_v)
DTYPES = (torch.bfloat16, torch.float8_e4m3fn)
LAYOUTS = ("bshd", "bhsd")
CAUSAL_WINDOWS = ((-1, -1), (-1, 0), (None, None))  # window_size values that mean "plain causal mask"
FLOAT32 = torch.finfo(torch.float32)


@dataclass(frozen=True)
class Problem:
    """The shape of one attention call, read from q, k and v."""

    batch: int
    seqlen: int
    heads: int
    heads_k: int
    d_qk: int
    d_v: int
    dtype: torch.dtype
    layout: str

    @property
    def seq_dim(self) -> int:
        return 1 if self.layout == "bshd" else 2

    @property
    def is_fp8(self) -> bool:
        return self.dtype == torch.float8_e4m3fn


def _fa3_order_error(name: str) -> TypeError:
    return TypeError(
        f"{name} is a bool: this looks like flash-attn 3's positional order (q, k, v, softmax_scale, causal); "
        "ZYFA follows flash-attn 2's order (q, k, v, dropout_p, softmax_scale, causal, ...): pass softmax_scale "
        "and causal by keyword"
    )


def _is_real(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def flash_attn_options(*, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes) -> None:
    """The flash-attn arguments ZYFA accepts: causal attention without dropout, softcap or ALiBi."""
    for name, value in (("dropout_p", dropout_p), ("softmax_scale", softmax_scale)):
        if isinstance(value, bool):
            raise _fa3_order_error(name)
    if not _is_real(dropout_p):
        raise TypeError(f"dropout_p must be a float, got {type(dropout_p).__name__}")
    if dropout_p != 0:
        raise ValueError(
            f"dropout_p={dropout_p}: ZYFA has no dropout, dropout_p must be 0.0 (to give softmax_scale "
            "positionally as in flash-attn 3, pass it by keyword instead)"
        )
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if not causal:
        raise ValueError("causal=False: ZYFA computes causal attention only, pass causal=True")
    if not isinstance(window_size, (tuple, list)) or tuple(window_size) not in CAUSAL_WINDOWS:
        raise ValueError(
            f"window_size={window_size!r}: ZYFA has no sliding window; use (-1, -1), (-1, 0) or (None, None)"
        )
    if not _is_real(softcap):
        raise TypeError(f"softcap must be a float, got {type(softcap).__name__}")
    if softcap != 0:
        raise ValueError(f"softcap={softcap}: ZYFA has no logit soft-capping, softcap must be 0.0")
    if alibi_slopes is not None:
        raise ValueError("alibi_slopes: ZYFA has no ALiBi bias, alibi_slopes must be None")


def softmax_scale_value(softmax_scale, d_qk: int) -> float:
    """softmax_scale as a Python float; None means 1/sqrt(d_qk) as in flash-attn."""
    if softmax_scale is None:
        return d_qk**-0.5
    if not _is_real(softmax_scale):
        raise TypeError(f"softmax_scale must be a Python float or None, got {type(softmax_scale).__name__}")
    if not 0 < softmax_scale < math.inf:  # comparisons only (no math.isfinite): traceable for symbolic floats
        raise ValueError(f"softmax_scale={softmax_scale}: must be positive and finite")
    return float(softmax_scale) if isinstance(softmax_scale, int) else softmax_scale


def _tensor(name: str, t) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    return t


def attention_inputs(q, k, v, layout) -> Problem:
    """q, k, v of one call: dtype, device, rank, and the shape rules (MHA/GQA/MQA, head dims, equal lengths)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r}: must be 'bshd' (batch, seqlen, heads, dim) or 'bhsd'")
    tensors = {"q": _tensor("q", q), "k": _tensor("k", k), "v": _tensor("v", v)}
    if q.dtype not in DTYPES:
        raise TypeError(f"q has dtype {q.dtype}: ZYFA takes torch.bfloat16 or torch.float8_e4m3fn")
    for name, t in tensors.items():
        if t.dtype != q.dtype:
            raise TypeError(f"{name} has dtype {t.dtype} but q has {q.dtype}: q, k and v must share one dtype")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}: all inputs must be on one device")
        if t.dim() != 4:
            raise ValueError(f"{name} has {t.dim()} dimensions, expected 4 (batch, {_layout_words(layout)})")
    dims = {}
    for name, t in tensors.items():
        b, x, y, d = t.shape
        s, h = (x, y) if layout == "bshd" else (y, x)
        dims[name] = (b, s, h, d)
    (batch, seqlen, heads, d_qk), (kb, ks, heads_k, kd), (vb, vs, vh, d_v) = dims.values()
    if batch < 1 or seqlen < 1:
        raise ValueError(f"q has batch {batch} and seqlen {seqlen}: empty batches or sequences are not supported")
    if kb != batch or vb != batch:
        raise ValueError(f"batch sizes differ: q {batch}, k {kb}, v {vb}; they must be equal")
    if ks != seqlen or vs != seqlen:
        raise ValueError(f"sequence lengths differ: q {seqlen}, k {ks}, v {vs}; ZYFA needs seqlen_q == seqlen_k")
    if vh != heads_k:
        raise ValueError(f"k has {heads_k} heads but v has {vh}: they must be equal")
    if heads_k < 1 or heads % heads_k != 0:
        raise ValueError(f"q has {heads} heads, k has {heads_k}: nheads must be a multiple of nheads_k")
    if kd != d_qk:
        raise ValueError(f"q has head dim {d_qk} but k has {kd}: they must be equal")
    if (d_qk, d_v) not in HEAD_DIMS:
        raise ValueError(f"head dims d_qk={d_qk}, d_v={d_v}: ZYFA supports d_qk = d_v = 128 or d_qk = 192, d_v = 128")
    return Problem(batch, seqlen, heads, heads_k, d_qk, d_v, q.dtype, layout)


def _layout_words(layout: str) -> str:
    return "seqlen, heads, dim" if layout == "bshd" else "heads, seqlen, dim"


def _descale_float(name: str, value) -> float:
    if not FLOAT32.tiny <= value <= FLOAT32.max:  # also false for NaN
        raise ValueError(f"{name}={value}: a descale must be a positive, finite, normal float32 value")
    return value


def descales(problem: Problem, device: torch.device, **given) -> tuple[torch.Tensor | None, ...]:
    """q_descale, k_descale, v_descale as float32 (batch, heads_k) tensors on q's device (None for BF16).

    Each may be a Python float, a float32 tensor with one element, or a float32 (batch, heads_k) tensor
    (flash-attn 3's shape; expanded views are fine). A tensor's values are never read here: they must hold
    positive normal float32 numbers.
    """
    if not problem.is_fp8:
        for name, value in given.items():
            if value is not None:
                raise ValueError(f"{name} is given but the inputs are BF16: descales apply to FP8 inputs only")
        return (None,) * len(given)
    shape = (problem.batch, problem.heads_k)
    out = []
    for name, value in given.items():
        if value is None:
            raise ValueError(f"{name} is missing: FP8 inputs need q_descale, k_descale and v_descale")
        if isinstance(value, torch.Tensor):
            if value.dtype != torch.float32:
                raise TypeError(f"{name} has dtype {value.dtype}: descale tensors must be torch.float32")
            if value.device != device:
                raise ValueError(f"{name} is on {value.device} but q is on {device}: all inputs must be on one device")
            if value.numel() == 1:
                value = value.reshape(1, 1).expand(shape)
            elif tuple(value.shape) != shape:
                raise ValueError(
                    f"{name} has shape {tuple(value.shape)}: expected one element or (batch, nheads_k) = {shape}"
                )
            out.append(value.contiguous())
        elif _is_real(value):
            out.append(torch.full(shape, _descale_float(name, value), dtype=torch.float32, device=device))
        else:
            raise TypeError(f"{name} must be a float or a float32 tensor, got {type(value).__name__}")
    return tuple(out)


def op_inputs(q, k, v, q_descale, k_descale, v_descale, softmax_scale, layout) -> Problem:
    """The invariants the backends rely on, checked by torch.ops.zyfa.fwd itself (real and fake)."""
    problem = attention_inputs(q, k, v, layout)
    if problem.seqlen % SEQLEN_ALIGN != 0:
        raise ValueError(f"seqlen {problem.seqlen}: torch.ops.zyfa.fwd needs a multiple of {SEQLEN_ALIGN}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not t.is_contiguous():
            raise ValueError(f"{name} is not contiguous: torch.ops.zyfa.fwd takes contiguous tensors")
    named = (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale))
    for name, d in named:
        if (d is None) == problem.is_fp8:
            raise ValueError(f"{name}: torch.ops.zyfa.fwd needs descales for FP8 inputs and none for BF16")
        if d is not None and not (
            d.dtype == torch.float32
            and d.device == q.device
            and tuple(d.shape) == (problem.batch, problem.heads_k)
            and d.is_contiguous()
        ):
            raise ValueError(f"{name}: torch.ops.zyfa.fwd needs a contiguous float32 (batch, nheads_k) tensor")
    if not 0 < softmax_scale < math.inf:
        raise ValueError(f"softmax_scale={softmax_scale}: must be positive and finite")
    return problem


def varlen_batch(name: str, cu_seqlens, max_seqlen, total: int, device: torch.device) -> int:
    """Batch size of a varlen input whose sequences all have length max_seqlen.

    Equal lengths mean total == batch * max_seqlen. When cu_seqlens is on the CPU its values are compared too;
    on a GPU that comparison would wait for the device, so there the check uses total and max_seqlen alone.
    """
    if not isinstance(cu_seqlens, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(cu_seqlens).__name__}")
    if cu_seqlens.dtype != torch.int32 or cu_seqlens.dim() != 1 or cu_seqlens.shape[0] < 2:
        raise ValueError(f"{name} must be a 1-D torch.int32 tensor of batch + 1 offsets, got {cu_seqlens.dtype} "
                         f"of shape {tuple(cu_seqlens.shape)}")
    if cu_seqlens.device != device:
        raise ValueError(f"{name} is on {cu_seqlens.device} but q is on {device}: all inputs must be on one device")
    if isinstance(max_seqlen, bool) or not isinstance(max_seqlen, (int, torch.SymInt)):
        raise TypeError(f"max_seqlen for {name} must be an int, got {type(max_seqlen).__name__}")
    if max_seqlen < 1:
        raise ValueError(f"max_seqlen={max_seqlen} for {name}: empty sequences are not supported")
    batch = cu_seqlens.shape[0] - 1
    if total != batch * max_seqlen:
        raise ValueError(
            f"{name}: {batch} sequences hold {total} tokens, not {batch} * max_seqlen = {batch * max_seqlen}; "
            "ZYFA supports varlen batches of equal lengths only"
        )
    if cu_seqlens.device.type == "cpu":
        expected = torch.arange(batch + 1, dtype=torch.int32) * max_seqlen
        message = f"{name} must be 0, L, 2L, ... with L = max_seqlen: unequal varlen lengths are not supported"
        if torch.compiler.is_compiling():  # a traced graph cannot branch on values: assert when it runs
            torch._assert_async((cu_seqlens == expected).all(), message)
        elif not torch.equal(cu_seqlens, expected):
            raise ValueError(f"{message}, got {cu_seqlens.tolist()}")
    return batch
