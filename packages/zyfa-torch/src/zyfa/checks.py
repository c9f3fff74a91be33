"""Argument checks of the public API and of the custom op, with errors that name the argument and the rule.

Numbers are taken by value whatever their type (Python, numpy or torch scalars alike; bools are refused where a
number is meant). The checks read shapes, dtypes and devices, and tensor values only where they are on the CPU:
nothing waits for a GPU, and under torch.compile the value checks are left to run time or skipped (documented in
docs/loader.md, "Ranges").

The FP32 range the contract covers: every scaled score c * (q . k), with c = softmax_scale * log2(e) * q_descale *
k_descale, and the output O / l * v_descale must be finite. The checks refuse what they can see without reading
a GPU: descales or a softmax_scale for which the largest possible score (448^2 * d_qk for FP8) or output (448 *
v_descale) overflows, and on the CPU BF16 inputs whose largest |q| * |k| * d_qk * c overflows.
"""

from __future__ import annotations

import math
import numbers
import operator
from dataclasses import dataclass

import torch

from .backends import dispatch

DTYPES = (torch.bfloat16, torch.float8_e4m3fn)
LAYOUTS = ("bshd", "bhsd")
CAUSAL_WINDOWS = ((-1, -1), (-1, 0), (None, None))  # window_size values that mean "plain causal mask"
FLOAT32 = torch.finfo(torch.float32)
BF16_MAX = torch.finfo(torch.bfloat16).max
E4M3_MAX = torch.finfo(torch.float8_e4m3fn).max
LOG2E = 1.0 / math.log(2.0)


@torch.compiler.assume_constant_result
def _raise_while_tracing(kind: str, message: str):
    """Raised while torch.compile traces: dynamo runs this eagerly, so its error shows ZYFA's message first."""
    raise {"ValueError": ValueError, "TypeError": TypeError}[kind](message)


def value_error(message: str) -> ValueError:
    """The ValueError to raise for a refused argument (under torch.compile it is raised here, see above)."""
    if torch.compiler.is_compiling():
        _raise_while_tracing("ValueError", message)
    return ValueError(message)


def type_error(message: str) -> TypeError:
    """The TypeError to raise for an argument of a wrong type (under torch.compile raised here, see above)."""
    if torch.compiler.is_compiling():
        _raise_while_tracing("TypeError", message)
    return TypeError(message)


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


def _fa3_order_error(name: str) -> str:
    return (
        f"{name} is a bool: this looks like flash-attn 3's positional order (q, k, v, softmax_scale, causal); "
        "ZYFA follows flash-attn 2's order (q, k, v, dropout_p, softmax_scale, causal, ...): pass softmax_scale "
        "and causal by keyword"
    )


def _is_bool(x) -> bool:
    """A Python or numpy bool (numpy's is not a subclass of bool)."""
    return isinstance(x, bool) or type(x).__name__ in ("bool_", "bool") and type(x).__module__ == "numpy"


def _type_name(x) -> str:
    t = type(x)
    return t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _is_real(x) -> bool:
    return isinstance(x, (numbers.Real, torch.SymFloat, torch.SymInt)) and not _is_bool(x)


def _float(name: str, x) -> float:
    """x as a Python float (symbolic floats under torch.compile pass through); ValueError if it has no float value."""
    if type(x) is float or isinstance(x, torch.SymFloat):
        return x
    try:
        return float(x)
    except OverflowError:
        raise value_error(f"{name}={x!r} overflows float64, far outside the float32 range ZYFA computes in") from None


_PLAIN_NUMBERS = (float, int)


def flash_attn_options(*, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes) -> None:
    """The flash-attn arguments ZYFA accepts: causal attention without dropout, softcap or ALiBi."""
    if (causal is True and alibi_slopes is None and type(dropout_p) in _PLAIN_NUMBERS and dropout_p == 0
            and type(softcap) in _PLAIN_NUMBERS and softcap == 0 and type(window_size) is tuple
            and window_size in CAUSAL_WINDOWS and type(softmax_scale) in (float, int, type(None))):
        return  # the common call, by value and type alone; the rest explains what is wrong
    for name, value in (("dropout_p", dropout_p), ("softmax_scale", softmax_scale)):
        if _is_bool(value):
            raise type_error(_fa3_order_error(name))
    if not _is_real(dropout_p):
        raise type_error(f"dropout_p must be a float, got {_type_name(dropout_p)}")
    if dropout_p != 0:
        raise value_error(
            f"dropout_p={dropout_p}: ZYFA has no dropout, dropout_p must be 0.0 (to give softmax_scale "
            "positionally as in flash-attn 3, pass it by keyword instead)"
        )
    if not _is_bool(causal):
        raise type_error(f"causal must be a bool (True), got {_type_name(causal)}")
    if not causal:
        raise value_error("causal=False: ZYFA computes causal attention only, pass causal=True")
    if not isinstance(window_size, (tuple, list)) or tuple(window_size) not in CAUSAL_WINDOWS:
        raise value_error(
            f"window_size={window_size!r}: ZYFA has no sliding window; use (-1, -1), (-1, 0) or (None, None)"
        )
    if not _is_real(softcap):
        raise type_error(f"softcap must be a float, got {_type_name(softcap)}")
    if softcap != 0:
        raise value_error(f"softcap={softcap}: ZYFA has no logit soft-capping, softcap must be 0.0")
    if alibi_slopes is not None:
        raise value_error("alibi_slopes: ZYFA has no ALiBi bias, alibi_slopes must be None")


# The largest softmax_scale whose FP32 product with log2(e) (what the kernels take) is finite.
SOFTMAX_SCALE_MAX = FLOAT32.max / LOG2E


def softmax_scale_value(softmax_scale, d_qk: int) -> float:
    """softmax_scale as a Python float; None means 1/sqrt(d_qk) as in flash-attn."""
    if softmax_scale is None:
        return d_qk**-0.5
    if not _is_real(softmax_scale):
        raise type_error(f"softmax_scale must be a float or None, got {_type_name(softmax_scale)}")
    scale = _float("softmax_scale", softmax_scale)
    # comparisons only (no math.isfinite): traceable for symbolic floats; NaN fails both
    if not FLOAT32.tiny <= scale <= SOFTMAX_SCALE_MAX:
        raise value_error(f"softmax_scale={softmax_scale}: must be positive and finite, within the float32 range the "
                         f"kernels compute in, [{FLOAT32.tiny:.3g}, {SOFTMAX_SCALE_MAX:.3g}]")
    return scale


def p_mode_value(p_mode, problem: Problem) -> str | None:
    """The API's p_mode: None (the target's default) or "exact" / "lean", for FP8 inputs only."""
    if p_mode is None:
        return None
    if not isinstance(p_mode, str):
        raise type_error(f"p_mode must be a str or None, got {_type_name(p_mode)}")
    if not problem.is_fp8:
        raise value_error(f"p_mode={p_mode!r} is given but the inputs are BF16: p_mode applies to FP8 inputs only "
                         "(BF16 kernels keep P in BF16)")
    if p_mode not in dispatch.FP8_P_MODES:
        raise value_error(f"p_mode={p_mode!r}: must be one of {list(dispatch.FP8_P_MODES)} or None (the target's "
                         "default)")
    return str(p_mode)


def _tensor(name: str, t) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise type_error(f"{name} must be a torch.Tensor, got {_type_name(t)}")
    return t


PROBLEMS = 256  # accepted (layout, shapes, dtypes, devices) whose Problem is kept: the checks' own cache
_problems: dict[tuple, Problem] = {}


def attention_inputs(q, k, v, layout) -> Problem:
    """q, k, v of one call: dtype, device, rank, and the shape rules (MHA/GQA/MQA, head dims, equal lengths).

    The rules read only what the cache key holds, so plain tensors of an accepted geometry skip them (bounded:
    emptied when full); anything refused raises every time, and tensor subclasses (fake tensors under
    torch.compile) are always checked in full."""
    if type(q) is type(k) is type(v) is torch.Tensor:
        key = (layout, q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, q.device, k.device, v.device)
        problem = _problems.get(key)
        if problem is None:
            problem = _attention_inputs(q, k, v, layout)
            if len(_problems) >= PROBLEMS:
                _problems.clear()  # bounded, and safe under threads: start over
            _problems[key] = problem
        return problem
    return _attention_inputs(q, k, v, layout)


def _attention_inputs(q, k, v, layout) -> Problem:
    if layout not in LAYOUTS:
        raise value_error(f"layout={layout!r}: must be 'bshd' (batch, seqlen, heads, dim) or 'bhsd'")
    _tensor("q", q), _tensor("k", k), _tensor("v", v)
    dtype, device = q.dtype, q.device
    if dtype not in DTYPES:
        raise type_error(f"q has dtype {dtype}: ZYFA takes torch.bfloat16 or torch.float8_e4m3fn")
    if k.dtype != dtype or v.dtype != dtype or k.device != device or v.device != device or (
            q.dim() != 4 or k.dim() != 4 or v.dim() != 4):
        for name, t in (("k", k), ("v", v), ("q", q)):
            if t.dtype != dtype:
                raise type_error(f"{name} has dtype {t.dtype} but q has {dtype}: q, k and v must share one dtype")
            if t.device != device:
                raise value_error(f"{name} is on {t.device} but q is on {device}: all inputs must be on one device")
            if t.dim() != 4:
                raise value_error(f"{name} has {t.dim()} dimensions, expected 4 (batch, {_layout_words(layout)})")
    if layout == "bshd":
        batch, seqlen, heads, d_qk = q.shape
        kb, ks, heads_k, kd = k.shape
        vb, vs, vh, d_v = v.shape
    else:
        batch, heads, seqlen, d_qk = q.shape
        kb, heads_k, ks, kd = k.shape
        vb, vh, vs, d_v = v.shape
    if batch < 1 or seqlen < 1:
        raise value_error(f"q has batch {batch} and seqlen {seqlen}: empty batches or sequences are not supported")
    if kb != batch or vb != batch:
        raise value_error(f"batch sizes differ: q {batch}, k {kb}, v {vb}; they must be equal")
    if ks != seqlen or vs != seqlen:
        raise value_error(f"sequence lengths differ: q {seqlen}, k {ks}, v {vs}; ZYFA needs seqlen_q == seqlen_k")
    if vh != heads_k:
        raise value_error(f"k has {heads_k} heads but v has {vh}: they must be equal")
    if heads_k < 1 or heads % heads_k != 0:
        raise value_error(f"q has {heads} heads, k has {heads_k}: nheads must be a multiple of nheads_k")
    if kd != d_qk:
        raise value_error(f"q has head dim {d_qk} but k has {kd}: they must be equal")
    if (d_qk, d_v) not in dispatch.head_dims():
        raise value_error(f"head dims d_qk={d_qk}, d_v={d_v}: ZYFA's kernels take {dispatch.describe_head_dims()}")
    return Problem(batch, seqlen, heads, heads_k, d_qk, d_v, dtype, layout)


def _layout_words(layout: str) -> str:
    return "seqlen, heads, dim" if layout == "bshd" else "heads, seqlen, dim"


def _descale_float(name: str, value) -> float:
    value = _float(name, value)
    if not FLOAT32.tiny <= value <= FLOAT32.max:  # also false for NaN
        raise value_error(f"{name}={value}: a descale must be a positive, finite, normal float32 value "
                         f"(in [{FLOAT32.tiny:.3g}, {FLOAT32.max:.3g}])")
    return value


def descales(problem: Problem, device: torch.device, softmax_scale: float,
             **given) -> tuple[torch.Tensor | float | None, ...]:
    """q_descale, k_descale, v_descale: each a Python float (checked here) or a float32 tensor on q's device of one
    element or of shape (batch, heads_k), as given (any strides: nothing is expanded or copied); None for BF16.

    A tensor's values are checked where they are on the CPU (cpu_values); on a GPU they must hold positive normal
    float32 numbers in the contract's range, unchecked.
    """
    if not problem.is_fp8:
        for name, value in given.items():
            if value is not None:
                raise value_error(f"{name} is given but the inputs are BF16: descales apply to FP8 inputs only")
        return (None,) * len(given)
    shape = (problem.batch, problem.heads_k)
    out = []
    for name, value in given.items():
        if value is None:
            raise value_error(f"{name} is missing: FP8 inputs need q_descale, k_descale and v_descale")
        if isinstance(value, torch.Tensor):
            if value.dtype != torch.float32:
                raise type_error(f"{name} has dtype {value.dtype}: descale tensors must be torch.float32")
            if value.device != device:
                raise value_error(f"{name} is on {value.device} but q is on {device}: all inputs must be on one device")
            if value.numel() != 1 and value.shape != shape:
                raise value_error(
                    f"{name} has shape {tuple(value.shape)}: expected one element or (batch, nheads_k) = {shape}"
                )
            out.append(value)
        elif _is_real(value):
            out.append(_descale_float(name, value))
        else:
            raise type_error(f"{name} must be a float or a float32 tensor, got {_type_name(value)}")
    _check_ranges(problem, *(None if isinstance(d, torch.Tensor) else d for d in out), softmax_scale)
    return tuple(out)


def _values_visible(t: torch.Tensor) -> bool:
    """Whether t's values can be read here: a plain CPU tensor, outside tracing and dispatch modes (fake tensors)."""
    return (t.device.type == "cpu" and type(t) is torch.Tensor and not torch.compiler.is_compiling()
            and not torch._C._len_torch_dispatch_stack())


def _largest(t: torch.Tensor) -> float:
    return t.abs().max().float().item()


def _check_ranges(problem: Problem, q_descale, k_descale, v_descale, softmax_scale) -> None:
    """The contract's FP32 range (module docstring), checked for the values that are known (None: unknown)."""
    if q_descale is not None and k_descale is not None:
        c = q_descale * k_descale * softmax_scale * LOG2E
        if E4M3_MAX * E4M3_MAX * problem.d_qk * c > FLOAT32.max:
            raise value_error(
                f"q_descale * k_descale * softmax_scale = {c / LOG2E:.3g}: FP8 scores up to 448^2 * d_qk times it "
                f"(and log2(e)) would overflow float32; ZYFA covers q_descale * k_descale * softmax_scale <= "
                f"{FLOAT32.max / (E4M3_MAX * E4M3_MAX * problem.d_qk * LOG2E):.3g} at d_qk = {problem.d_qk}")
    if v_descale is not None and E4M3_MAX * v_descale > BF16_MAX:
        raise value_error(f"v_descale={v_descale:.3g}: outputs up to 448 * v_descale would overflow BF16; ZYFA "
                         f"covers v_descale <= {BF16_MAX / E4M3_MAX:.3g}")


def cpu_values(problem: Problem, q, k, q_descale, k_descale, v_descale, softmax_scale: float) -> None:
    """The value rules a check can see on the CPU without waiting for a device: descale tensors hold positive
    normal float32 values in the contract's range, and BF16 scores stay finite in FP32."""
    if not _values_visible(q):
        return
    if problem.is_fp8:
        largest = {}
        for name, d in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale)):
            if isinstance(d, torch.Tensor):
                if not _values_visible(d):
                    return
                smallest = d.min().item()
                if not (FLOAT32.tiny <= smallest and d.max().item() <= FLOAT32.max):  # NaN fails too
                    raise value_error(f"{name} holds {smallest if smallest < FLOAT32.tiny else d.max().item():.3g}: "
                                     "descales must be positive, finite, normal float32 values "
                                     f"(in [{FLOAT32.tiny:.3g}, {FLOAT32.max:.3g}])")
                largest[name] = d.max().item()
            else:
                largest[name] = d
        _check_ranges(problem, largest["q_descale"], largest["k_descale"], largest["v_descale"], softmax_scale)
        return
    reach = _largest(q) * _largest(k) * problem.d_qk * softmax_scale * LOG2E
    if math.isnan(reach):
        raise value_error("q or k holds NaN: the scores and the output would be NaN")
    if not reach <= FLOAT32.max:
        raise value_error(f"q and k: max|q| * max|k| * d_qk * softmax_scale * log2(e) = {reach:.3g} exceeds the "
                         f"float32 range of the scores ({FLOAT32.max:.3g}); scale the inputs down")


def op_inputs(q, k, v, q_descale, k_descale, v_descale, softmax_scale, layout, p_mode) -> Problem:
    """The invariants the backends rely on, checked by torch.ops.zyfa.fwd itself (real and fake)."""
    problem = attention_inputs(q, k, v, layout)
    named = (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale))
    for name, d in named:
        if (d is None) == problem.is_fp8:
            raise value_error(f"{name}: torch.ops.zyfa.fwd needs descales for FP8 inputs and none for BF16")
        if d is not None and not (
            d.dtype == torch.float32
            and d.device == q.device
            and (d.numel() == 1 or tuple(d.shape) == (problem.batch, problem.heads_k))
        ):
            raise value_error(f"{name}: torch.ops.zyfa.fwd needs a float32 tensor of one element or of shape "
                              "(batch, nheads_k) (any strides)")
    if not 0 < softmax_scale <= SOFTMAX_SCALE_MAX:
        raise value_error(f"softmax_scale={softmax_scale}: must be positive and finite")
    if p_mode is not None and (not problem.is_fp8 or p_mode not in dispatch.FP8_P_MODES):
        raise value_error(f"p_mode={p_mode!r}: torch.ops.zyfa.fwd takes None, or 'exact' / 'lean' for FP8 inputs")
    return problem


def int_value(name: str, x) -> int:
    """An integer argument by value: Python, numpy or torch integers (torch.SymInt under torch.compile), no bool."""
    if isinstance(x, torch.SymInt):
        return x
    if _is_bool(x) or isinstance(x, torch.Tensor):
        raise type_error(f"{name} must be an int, got {_type_name(x)}")
    try:
        return operator.index(x)
    except TypeError:
        raise type_error(f"{name} must be an int, got {_type_name(x)}") from None


def varlen_batch(name: str, cu_seqlens, max_seqlen, total: int, device: torch.device) -> int:
    """Batch size of a varlen input whose sequences all have length max_seqlen.

    Equal lengths mean total == batch * max_seqlen. When cu_seqlens is on the CPU its values are compared too;
    on a GPU that comparison would wait for the device, so there the check uses total and max_seqlen alone.
    """
    if not isinstance(cu_seqlens, torch.Tensor):
        raise type_error(f"{name} must be a torch.Tensor, got {_type_name(cu_seqlens)}")
    if cu_seqlens.dtype != torch.int32 or cu_seqlens.dim() != 1 or cu_seqlens.shape[0] < 2:
        raise value_error(f"{name} must be a 1-D torch.int32 tensor of batch + 1 offsets, got {cu_seqlens.dtype} "
                         f"of shape {tuple(cu_seqlens.shape)}")
    if cu_seqlens.device != device:
        raise value_error(f"{name} is on {cu_seqlens.device} but q is on {device}: all inputs must be on one device")
    max_seqlen = int_value(f"max_seqlen for {name}", max_seqlen)
    if max_seqlen < 1:
        raise value_error(f"max_seqlen={max_seqlen} for {name}: empty sequences are not supported")
    batch = cu_seqlens.shape[0] - 1
    if total != batch * max_seqlen:
        raise value_error(
            f"{name}: {batch} sequences hold {total} tokens, not {batch} * max_seqlen = {batch * max_seqlen}; "
            "ZYFA supports varlen batches of equal lengths only"
        )
    if cu_seqlens.device.type == "cpu":
        expected = torch.arange(batch + 1, dtype=torch.int32) * max_seqlen
        message = f"{name} must be 0, L, 2L, ... with L = max_seqlen: unequal varlen lengths are not supported"
        if torch.compiler.is_compiling():  # a traced graph cannot branch on values: assert when it runs
            torch._assert_async((cu_seqlens == expected).all(), message)
        elif not torch.equal(cu_seqlens, expected):
            raise value_error(f"{message}, got {cu_seqlens.tolist()}")
    return batch
