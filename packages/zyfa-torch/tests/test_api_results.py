"""Results of the public API: accuracy against fp64, padding exactness, and identical results across call forms."""

from __future__ import annotations

import pytest
import torch

from zyfa import (
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
    fp8_quantize,
)

BF16, FP8 = torch.bfloat16, torch.float8_e4m3fn

CONFIGS = [  # batch, seqlen, heads, heads_k, d_qk, d_v
    (1, 256, 2, 2, 128, 128),  # MHA, no padding
    (2, 300, 4, 1, 128, 128),  # MQA, padded to 512
    (1, 77, 4, 2, 192, 128),  # GQA, d_qk = 192
    (2, 1, 2, 2, 128, 128),  # a single token
]


def equal(a, b):
    """Bitwise equality of tensors or tuples of tensors."""
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(-1), b.view(-1))
    return len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("dtype", [BF16, FP8], ids=["bf16", "fp8"])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "b{}s{}h{}k{}d{}v{}".format(*c))
def test_matches_fp64(helpers, config, dtype, layout):
    batch, seqlen, heads, heads_k, d_qk, d_v = config
    (q, k, v), descales = helpers.make_inputs(batch, seqlen, heads, heads_k, d_qk, d_v, dtype, layout)
    out, lse = flash_attn_func(q, k, v, causal=True, layout=layout, return_lse=True, **descales)
    assert out.dtype == BF16 and out.is_contiguous()
    assert out.shape == (q.shape[:3] + (d_v,))
    assert lse.dtype == torch.float32 and lse.shape == (batch, heads, seqlen) and lse.is_contiguous()
    ref_out, ref_lse = helpers.attention_fp64(q, k, v, descales=tuple(descales.values()) or (1.0,) * 3, layout=layout)
    assert helpers.relative_rms(out, ref_out) < helpers.OUT_RTOL[dtype]
    assert (lse.double() - ref_lse).abs().max().item() < helpers.LSE_ATOL[dtype]


def test_softmax_scale_is_used(helpers):
    (q, k, v), _ = helpers.make_inputs(seqlen=100, d_qk=192)
    default = flash_attn_func(q, k, v, causal=True)
    assert equal(default, flash_attn_func(q, k, v, causal=True, softmax_scale=192**-0.5))
    assert equal(flash_attn_func(q, k, v, causal=True, softmax_scale=1), flash_attn_func(q, k, v, causal=True,
                                                                                         softmax_scale=1.0))
    out, lse = flash_attn_func(q, k, v, causal=True, softmax_scale=0.3, return_lse=True)
    ref_out, ref_lse = helpers.attention_fp64(q, k, v, softmax_scale=0.3)
    assert helpers.relative_rms(out, ref_out) < helpers.OUT_RTOL[BF16]
    assert (lse.double() - ref_lse).abs().max().item() < helpers.LSE_ATOL[BF16]


def test_per_head_descales(helpers):
    """flash-attn 3's (batch, nheads_k) descales scale each KV head group separately."""
    (q, k, v), _ = helpers.make_inputs(batch=2, seqlen=96, heads=4, heads_k=2, dtype=BF16)
    q8, k8, v8 = (t.to(FP8) for t in (q, k, v))
    descales = [torch.tensor([[0.5, 0.25], [1.0, 2.0]]) * f for f in (0.1, 0.2, 3.0)]
    out = flash_attn_func(q8, k8, v8, causal=True, q_descale=descales[0], k_descale=descales[1], v_descale=descales[2])
    ref_out, _ = helpers.attention_fp64(q8, k8, v8, descales=descales)
    assert helpers.relative_rms(out, ref_out) < helpers.OUT_RTOL[FP8]


def test_padding_is_exact(helpers):
    """Rows < 300 never see keys >= 300: random content there gives bitwise the same rows as zero padding."""
    (q, k, v), _ = helpers.make_inputs(batch=2, seqlen=512, heads=4, heads_k=2)
    padded = flash_attn_func(q[:, :300], k[:, :300], v[:, :300], causal=True, return_lse=True)
    full = flash_attn_func(q, k, v, causal=True, return_lse=True)
    assert equal(padded, (full[0][:, :300].contiguous(), full[1][:, :, :300].contiguous()))


@pytest.mark.parametrize("dtype", [BF16, FP8], ids=["bf16", "fp8"])
def test_layouts_identical(helpers, dtype):
    (q, k, v), descales = helpers.make_inputs(batch=2, seqlen=200, heads=4, heads_k=2, dtype=dtype)
    out, lse = flash_attn_func(q, k, v, causal=True, return_lse=True, **descales)
    t = [x.transpose(1, 2).contiguous() for x in (q, k, v)]
    out_t, lse_t = flash_attn_func(*t, causal=True, layout="bhsd", return_lse=True, **descales)
    assert out_t.shape == (2, 4, 200, 128) and out_t.is_contiguous()
    assert equal((out, lse), (out_t.transpose(1, 2).contiguous(), lse_t))


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_packed_identical(helpers, layout):
    (q, k, v), _ = helpers.make_inputs(batch=2, seqlen=130, heads=2, heads_k=2, layout=layout)
    dim = 2 if layout == "bshd" else 1
    expected = flash_attn_func(q, k, v, causal=True, layout=layout, return_lse=True)
    qkv = torch.stack([q, k, v], dim)
    assert equal(flash_attn_qkvpacked_func(qkv, causal=True, layout=layout, return_lse=True), expected)
    kv = torch.stack([k, v], dim)
    assert equal(flash_attn_kvpacked_func(q, kv, causal=True, layout=layout, return_lse=True), expected)


@pytest.mark.parametrize("dtype", [BF16, FP8], ids=["bf16", "fp8"])
def test_varlen_identical(helpers, dtype):
    batch, seqlen = 3, 70
    (q, k, v), descales = helpers.make_inputs(batch=batch, seqlen=seqlen, heads=4, heads_k=1, dtype=dtype)
    out, lse = flash_attn_func(q, k, v, causal=True, return_lse=True, **descales)
    cu = torch.arange(batch + 1, dtype=torch.int32) * seqlen
    flat = [t.reshape(batch * seqlen, t.shape[2], t.shape[3]) for t in (q, k, v)]
    out_v, lse_v = flash_attn_varlen_func(*flat, cu, cu, seqlen, seqlen, causal=True, return_lse=True, **descales)
    assert equal(out_v, out.reshape(batch * seqlen, 4, 128))
    assert equal(lse_v, lse.transpose(0, 1).reshape(4, batch * seqlen))  # flash-attn's varlen lse: (heads, total)


@pytest.mark.parametrize("window", [slice(10, 140), slice(20, 276)], ids=["padded", "unpadded"])
def test_strided_inputs_identical(helpers, window):
    """Slices of larger tensors (every other head, a window of the sequence) give the result of their copies."""
    (q, k, v), _ = helpers.make_inputs(batch=2, seqlen=300, heads=4, heads_k=4)
    q, k, v = (t[:, window, ::2] for t in (q, k, v))
    assert not q.is_contiguous()
    expected = flash_attn_func(*(t.contiguous() for t in (q, k, v)), causal=True)
    assert equal(flash_attn_func(q, k, v, causal=True), expected)


def test_gqa_equals_repeated_heads(helpers):
    (q, k, v), _ = helpers.make_inputs(batch=1, seqlen=100, heads=6, heads_k=2)
    gqa = flash_attn_func(q, k, v, causal=True, return_lse=True)
    k3, v3 = (t.repeat_interleave(3, dim=2) for t in (k, v))
    assert equal(gqa, flash_attn_func(q, k3, v3, causal=True, return_lse=True))


def test_descale_forms_identical(helpers):
    (q, k, v), _ = helpers.make_inputs(batch=2, seqlen=40, heads=4, heads_k=2)
    q8, k8, v8 = (t.to(FP8) for t in (q, k, v))

    def run(descale):
        return flash_attn_func(q8, k8, v8, causal=True, q_descale=descale, k_descale=descale, v_descale=descale)

    expected = run(0.375)
    for form in (
        torch.tensor(0.375),
        torch.tensor([0.375]),
        torch.tensor([[0.375]]),
        torch.full((2, 2), 0.375),
        torch.tensor(0.375).expand(2, 2),
        torch.full((2, 4), 0.375)[:, ::2],  # strided (batch, nheads_k)
    ):
        assert equal(run(form), expected)


def test_return_forms(helpers):
    (q, k, v), _ = helpers.make_inputs(seqlen=20)
    out = flash_attn_func(q, k, v, causal=True)
    assert isinstance(out, torch.Tensor)
    with_lse = flash_attn_func(q, k, v, causal=True, return_lse=True)
    probs = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert equal(with_lse[0], out) and len(probs) == 3 and probs[2] is None
    assert equal(probs[:2], with_lse)
    for window in ((-1, 0), (None, None)):
        assert equal(flash_attn_func(q, k, v, 0.0, None, True, window, 0.0, None, True), out)


def test_fp8_quantized_inputs_close_to_bf16(helpers):
    """End to end: fp8_quantize + FP8 attention stays near BF16 attention of the unquantized inputs."""
    (q, k, v), _ = helpers.make_inputs(batch=1, seqlen=256, heads=2, heads_k=2)
    (q8, qd), (k8, kd), (v8, vd) = (fp8_quantize(t) for t in (q, k, v))
    out8 = flash_attn_func(q8, k8, v8, causal=True, q_descale=qd, k_descale=kd, v_descale=vd)
    ref_out, _ = helpers.attention_fp64(q, k, v)
    assert helpers.relative_rms(out8, ref_out) < 0.1  # dominated by rounding q, k, v to e4m3 (~2**-5 each)


def test_requires_grad_runs_forward_and_backward_raises(helpers):
    (q, k, v), _ = helpers.make_inputs(seqlen=20)
    expected = flash_attn_func(q, k, v, causal=True)
    q.requires_grad_(True)
    out, lse = flash_attn_func(q, k, v, causal=True, return_lse=True)
    assert out.requires_grad and equal(out.detach(), expected)
    with pytest.raises(NotImplementedError, match="ZYFA is forward-only"):
        out.float().sum().backward()
    with pytest.raises(NotImplementedError, match="ZYFA is forward-only"):
        flash_attn_func(q, k, v, causal=True, return_lse=True)[1].sum().backward()
    with torch.no_grad():
        assert not flash_attn_func(q, k, v, causal=True).requires_grad
