"""Property tests over shapes, layouts, strides, dtypes, head dims, GQA ratios, p_mode, descale forms and call forms.

Each example compares one call form against the canonical call (contiguous (batch, seqlen, heads, dim) tensors,
float32 (batch, nheads_k) descales, the same p_mode): the results must be bitwise identical, and the canonical
result must match fp64 attention on the decoded inputs within the numerics' bounds (conftest: OUT_RTOL, LSE_ATOL).
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from zyfa import (
    flash_attn_func,
    flash_attn_kvpacked_func,
    flash_attn_qkvpacked_func,
    flash_attn_varlen_func,
)

BF16, FP8 = torch.bfloat16, torch.float8_e4m3fn
DESCALE_FORMS = ("float", "scalar tensor", "one element", "per head", "expanded")
CALL_FORMS = ("func", "qkvpacked", "kvpacked", "varlen")
STRIDES = ("contiguous", "sliced", "permuted", "channels_last")  # how the inputs are laid out in memory


@st.composite
def problems(draw):
    heads_k = draw(st.integers(1, 2))
    dtype = draw(st.sampled_from([BF16, FP8]))
    return {
        "dtype": dtype,
        "p_mode": draw(st.sampled_from([None, "exact", "lean"])) if dtype == FP8 else None,
        "batch": draw(st.integers(1, 2)),
        "seqlen": draw(st.integers(1, 300)),
        "heads_k": heads_k,
        "heads": heads_k * draw(st.sampled_from([1, 2, 3, 4])),
        "dims": draw(st.sampled_from([(128, 128), (192, 128)])),
        "layout": draw(st.sampled_from(["bshd", "bhsd"])),
        "strided": draw(st.sampled_from(STRIDES)),
        "descale_form": draw(st.sampled_from(DESCALE_FORMS)),
        "call": draw(st.sampled_from(CALL_FORMS)),
        "seed": draw(st.integers(0, 2**16)),
    }


def canonical_inputs(p):
    """Contiguous bshd q, k, v (decoded values of moderate size) and float32 (batch, nheads_k) descales."""
    g = torch.Generator().manual_seed(p["seed"])
    d_qk, d_v = p["dims"]
    shapes = ((p["heads"], d_qk), (p["heads_k"], d_qk), (p["heads_k"], d_v))
    tensors = [torch.randn(p["batch"], p["seqlen"], h, d, generator=g).to(p["dtype"]) for h, d in shapes]
    if p["dtype"] == BF16:
        return tensors, [None] * 3
    if p["descale_form"] == "per head":
        descales = [torch.rand(p["batch"], p["heads_k"], generator=g) * 0.5 + 0.25 for _ in range(3)]
    else:
        descales = [torch.full((p["batch"], p["heads_k"]), 2.0 ** -torch.randint(0, 4, (), generator=g).item())
                    for _ in range(3)]
    return tensors, descales


def descale_form(descale: torch.Tensor, form: str):
    """The same descale in one of the accepted forms."""
    first = descale[0, 0]
    return {
        "float": lambda: first.item(),
        "scalar tensor": lambda: first.clone(),
        "one element": lambda: first.reshape(1, 1, 1).clone(),
        "per head": lambda: descale,
        "expanded": lambda: first.reshape(1, 1).expand(descale.shape),
    }[form]()


def in_layout(t: torch.Tensor, layout: str, strided: str) -> torch.Tensor:
    """t (bshd) in `layout`, stored as `strided` says: contiguous, a view into a larger buffer (every other head,
    columns offset), stored (b, h, d, s) and permuted back (last dimension not contiguous), or channels_last."""
    if strided == "sliced":
        wide = torch.zeros(*t.shape[:2], t.shape[2] * 2, t.shape[3] + 8, dtype=torch.uint8).to(t.dtype)
        wide[:, :, ::2, 8:] = t
        t = wide[:, :, ::2, 8:]
    elif strided == "permuted":
        t = t.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)
    t = t.transpose(1, 2) if layout == "bhsd" else t
    if strided == "channels_last":
        t = t.contiguous(memory_format=torch.channels_last)
    return t


def call_form(p, q, k, v, descales):
    """(out, lse) of the call form of p, in the canonical bshd shapes, or None if the form does not apply."""
    layout, call = p["layout"], p["call"]
    kw = {"causal": True, "return_lse": True, "p_mode": p["p_mode"]}
    kw.update(zip(("q_descale", "k_descale", "v_descale"), descales, strict=True))
    qs, ks, vs = (in_layout(t, layout, p["strided"]) for t in (q, k, v))
    bshd = layout == "bshd"
    pack_dim = 2 if bshd else 1
    if call == "qkvpacked" and p["heads"] == p["heads_k"] and p["dims"] == (128, 128):
        out, lse = flash_attn_qkvpacked_func(torch.stack([qs, ks, vs], pack_dim), layout=layout, **kw)
    elif call == "kvpacked" and p["dims"] == (128, 128):
        out, lse = flash_attn_kvpacked_func(qs, torch.stack([ks, vs], pack_dim), layout=layout, **kw)
    elif call == "varlen":
        b, s = p["batch"], p["seqlen"]
        cu = torch.arange(b + 1, dtype=torch.int32) * s
        flat = [t.reshape(b * s, *t.shape[2:]) for t in (q, k, v)]
        out, lse = flash_attn_varlen_func(*flat, cu, cu, s, s, **kw)
        return out.reshape(q.shape[:3] + out.shape[-1:]), lse.reshape(-1, b, s).transpose(0, 1)
    else:
        out, lse = flash_attn_func(qs, ks, vs, layout=layout, **kw)
    return (out if bshd else out.transpose(1, 2)), lse


@settings(max_examples=40, deadline=None)
@given(p=problems())
def test_call_forms_identical_and_accurate(helpers, p):
    (q, k, v), descales = canonical_inputs(p)
    out, lse = flash_attn_func(q, k, v, causal=True, return_lse=True, q_descale=descales[0],
                               k_descale=descales[1], v_descale=descales[2], p_mode=p["p_mode"])
    forms = descales if p["dtype"] == BF16 else [descale_form(d, p["descale_form"]) for d in descales]
    out_f, lse_f = call_form(p, q, k, v, forms)
    assert torch.equal(out_f, out) and torch.equal(lse_f, lse)
    ref_out, ref_lse = helpers.attention_fp64(q, k, v, descales=descales if p["dtype"] == FP8 else (1.0,) * 3)
    if ref_out.norm() > 0:
        assert helpers.relative_rms(out, ref_out) < helpers.OUT_RTOL[p["dtype"]]
    assert (lse.double() - ref_lse).abs().max().item() < helpers.LSE_ATOL[p["dtype"]]
