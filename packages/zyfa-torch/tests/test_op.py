"""The custom op torch.ops.zyfa.fwd: opcheck, its own argument checks, fake tensors, and torch.compile of every
public function (fullgraph, aot_eager and inductor, static and dynamic shapes)."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import zyfa
from zyfa import (
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    fp8_quantize,
)

BF16, FP8 = torch.bfloat16, torch.float8_e4m3fn
fwd = torch.ops.zyfa.fwd.default
# torch's own modules that inductor imports still use torch.jit.script_method
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")


def op_args(batch=1, seqlen=256, heads=2, heads_k=1, d_qk=128, d_v=128, dtype=BF16, layout="bshd", p_mode=None):
    def t(h, d):
        shape = (batch, seqlen, h, d) if layout == "bshd" else (batch, h, seqlen, d)
        return torch.randn(shape).to(dtype)

    descales = [None] * 3 if dtype == BF16 else [torch.full((batch, heads_k), f) for f in (0.5, 0.25, 2.0)]
    return (t(heads, d_qk), t(heads_k, d_qk), t(heads_k, d_v), *descales, 0.1, layout, p_mode)


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"layout": "bhsd"}, {"dtype": FP8, "batch": 2}, {"dtype": FP8, "p_mode": "lean", "seqlen": 100},
     {"d_qk": 192, "heads": 4, "heads_k": 2, "seqlen": 300}],
    ids=["bf16", "bhsd", "fp8", "fp8-lean-unpadded", "d192-unpadded"],
)
def test_opcheck(kwargs):
    args = op_args(**kwargs)
    if args[0].dtype == FP8:
        # opcheck's schema test compares inputs with torch.allclose, which CPU torch lacks for float8: check the
        # schema's promise (no input mutated) by bytes instead and run the other tests.
        before = [a.clone() for a in args if isinstance(a, torch.Tensor)]
        fwd(*args)
        after = [a for a in args if isinstance(a, torch.Tensor)]
        assert all(torch.equal(x.view(torch.uint8), y.view(torch.uint8)) for x, y in zip(before, after, strict=True)
                   if x.dtype == FP8)
        utils = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
        torch.library.opcheck(fwd, args, test_utils=utils)
    else:
        torch.library.opcheck(fwd, args)


def test_op_returns_out_and_lse():
    out, lse = fwd(*op_args(batch=2, heads=4, heads_k=2, d_qk=192, layout="bhsd"))
    assert out.shape == (2, 4, 256, 128) and out.dtype == BF16 and out.is_contiguous()
    assert lse.shape == (2, 4, 256) and lse.dtype == torch.float32


def test_op_checks_its_inputs():
    q, k, v, qd, kd, vd, scale, layout, p_mode = op_args()
    with pytest.raises(ValueError, match="softmax_scale=-1.0: must be positive"):
        fwd(q, k, v, qd, kd, vd, -1.0, layout, p_mode)
    with pytest.raises(ValueError, match="q_descale: torch.ops.zyfa.fwd needs descales for FP8 inputs and none"):
        fwd(q, k, v, torch.ones(1, 1), kd, vd, scale, layout, p_mode)
    with pytest.raises(ValueError, match="p_mode='exact': torch.ops.zyfa.fwd takes None, or 'exact' / 'lean' for FP8"):
        fwd(q, k, v, qd, kd, vd, scale, layout, "exact")
    q8, k8, v8, qd8, kd8, vd8, _, _, _ = op_args(dtype=FP8)
    with pytest.raises(ValueError, match="k_descale: torch.ops.zyfa.fwd needs descales for FP8"):
        fwd(q8, k8, v8, qd8, None, vd8, scale, layout, None)
    with pytest.raises(ValueError, match=r"v_descale: torch.ops.zyfa.fwd needs a float32 tensor of one element or "
                       r"of shape \(batch, nheads_k\)"):
        fwd(q8, k8, v8, qd8, kd8, torch.ones(3), scale, layout, None)
    with pytest.raises(ValueError, match="q_descale: torch.ops.zyfa.fwd needs a float32 tensor"):
        fwd(q8, k8, v8, qd8.double(), kd8, vd8, scale, layout, None)
    with pytest.raises(ValueError, match="p_mode='fast'"):
        fwd(q8, k8, v8, qd8, kd8, vd8, scale, layout, "fast")


def test_op_takes_any_length_and_strides():
    """The op pads and copies nothing on the reference path: unpadded, strided inputs equal their copies."""
    q, k, v, qd, kd, vd, scale, layout, p_mode = op_args(seqlen=300, heads=4, heads_k=2)
    strided = [t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v)]
    assert not strided[0].is_contiguous()
    expected = fwd(q, k, v, qd, kd, vd, scale, layout, p_mode)
    got = fwd(*strided, qd, kd, vd, scale, layout, p_mode)
    assert expected[0].shape == (1, 300, 4, 128) and all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))


def test_op_takes_descales_of_one_element_and_strided_views():
    """One-element descales and (batch, heads_k) views of any strides give the results of their contiguous
    (batch, heads_k) copies: the backends broadcast them, nothing asks for contiguous descales."""
    q, k, v, qd, kd, vd, scale, layout, p_mode = op_args(dtype=FP8, batch=2, heads=4, heads_k=2)
    varied = [torch.tensor([[0.5, 0.25], [1.0, 2.0]]) * f for f in (1.0, 0.5, 4.0)]
    strided = [torch.stack([d, d], dim=-1)[..., 0] for d in varied]  # (2, 2) with strides (4, 2)
    assert strided[0].stride() == (4, 2)
    cases = [(varied, strided), ([d[:1, :1].expand(2, 2).contiguous() for d in varied], [d[:1, :1] for d in varied]),
             ([d[:1, :1].expand(2, 2).contiguous() for d in varied], [d[:1, :1].expand(2, 2) for d in varied]),
             ([d[:1, :1].expand(2, 2).contiguous() for d in varied], [d[0, :1] for d in varied])]
    for contiguous, given in cases:
        expected = fwd(q, k, v, *contiguous, scale, layout, p_mode)
        got = fwd(q, k, v, *given, scale, layout, p_mode)
        assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))


def test_fake_tensors_give_shapes_without_computing():
    """Long sequences are traced through the public API without running attention."""
    with FakeTensorMode():
        q = torch.empty(2, 5000, 8, 128, dtype=FP8)
        kv = torch.empty(2, 5000, 2, 2, 128, dtype=FP8)
        out, lse = flash_attn_kvpacked_func(
            q, kv, causal=True, return_lse=True,
            q_descale=1.0, k_descale=torch.ones(1), v_descale=torch.ones(2, 2),
        )
    assert out.shape == (2, 5000, 8, 128) and lse.shape == (2, 8, 5000)


def every_public_function(q, k, v, qkv, kv, cu_seqlens, descale, scale, float_descale):
    """Calls each public function once; q, k, v are BF16 (batch, seqlen, heads, 128). scale and float_descale are
    Python floats, which dynamic compilation traces as symbolic values."""
    b, s, h, d = q.shape
    q8, qd = fp8_quantize(q)
    k8, v8 = k.to(FP8), v.to(FP8)
    return (
        flash_attn_func(q, k, v, causal=True),
        flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True, layout="bhsd",
                        return_lse=True),
        flash_attn_qkvpacked_func(qkv, softmax_scale=scale, causal=True, return_attn_probs=True)[:2],
        flash_attn_kvpacked_func(q, kv, causal=True),
        flash_attn_varlen_func(q.reshape(b * s, h, d), k.reshape(b * s, -1, d), v.reshape(b * s, -1, d),
                               cu_seqlens, cu_seqlens, s, s, causal=True, return_lse=True),
        flash_attn_func(q8, k8, v8, causal=True, q_descale=qd, k_descale=float_descale,
                        v_descale=descale.expand(b, k.shape[2])),
        q8.view(torch.uint8),
        qd,
    )


def public_inputs(seqlen, batch=2, heads=2, heads_k=1):
    g = torch.Generator().manual_seed(seqlen)
    q, k, v = (torch.randn(batch, seqlen, h, 128, generator=g).to(BF16) for h in (heads, heads_k, heads_k))
    qkv = torch.randn(batch, seqlen, 3, heads, 128, generator=g).to(BF16)
    kv = torch.randn(batch, seqlen, 2, heads_k, 128, generator=g).to(BF16)
    cu_seqlens = torch.arange(batch + 1, dtype=torch.int32) * seqlen
    return q, k, v, qkv, kv, cu_seqlens, torch.tensor([0.25]), seqlen / 1000, 2.0 ** -(seqlen % 7)


def flat(results):
    if isinstance(results, torch.Tensor):
        return [results]
    return [t for r in results for t in flat(r)]


def check_compiled(backend: str, dynamic: bool):
    torch._dynamo.reset()
    compiled = torch.compile(every_public_function, backend=backend, fullgraph=True, dynamic=dynamic)
    for seqlen in (300, 200) if dynamic else (300,):  # dynamic: the second shape reuses the graph
        inputs = public_inputs(seqlen)
        for got, expected in zip(flat(compiled(*inputs)), flat(every_public_function(*inputs)), strict=True):
            assert got.shape == expected.shape and got.dtype == expected.dtype
            assert torch.equal(got, expected)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_compile_aot_eager(dynamic):
    check_compiled("aot_eager", dynamic)


@pytest.mark.slow
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_compile_inductor(dynamic):
    check_compiled("inductor", dynamic)


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_compile_requires_grad(backend):
    """Inputs that require grad run forward under torch.compile; backward raises the forward-only error."""
    torch._dynamo.reset()
    q, k, v = public_inputs(100)[:3]
    expected = flash_attn_func(q, k, v, causal=True)
    q.requires_grad_(True)
    out = torch.compile(lambda q: flash_attn_func(q, k, v, causal=True), backend=backend, fullgraph=True)(q)
    assert out.requires_grad and torch.equal(out.detach(), expected)
    with pytest.raises(NotImplementedError, match="ZYFA is forward-only"):
        out.float().sum().backward()


def test_compiled_varlen_checks_cpu_offsets():
    """Compiled, unequal CPU cu_seqlens still fail (as an assertion at run time: values are not traced)."""
    torch._dynamo.reset()
    q = torch.randn(200, 2, 128).to(BF16)

    def varlen(q, cu):
        return flash_attn_varlen_func(q, q, q, cu, cu, 100, 100, causal=True)

    compiled = torch.compile(varlen, backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(q, torch.tensor([0, 100, 200], dtype=torch.int32)),
                       varlen(q, torch.tensor([0, 100, 200], dtype=torch.int32)))
    with pytest.raises(RuntimeError, match="cu_seqlens_q must be 0, L, 2L, .*unequal varlen lengths"):
        compiled(q, torch.tensor([0, 90, 200], dtype=torch.int32))


def test_op_is_registered_by_import():
    assert zyfa.op.fwd is not None and hasattr(torch.ops.zyfa, "fwd") and hasattr(torch.ops.zyfa, "fwd_backward")
