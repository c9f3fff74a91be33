"""Arguments by value: numbers from numpy or Python, p_mode, the FP32 ranges the contract covers, descale values
visible on the CPU, strided views, errors under torch.compile, and the manifest-driven choices behind them."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import zyfa
import zyfa_kernels
from zyfa import flash_attn_func, flash_attn_varlen_func, fp8_quantize, numerics
from zyfa.backends import dispatch, reference

BF16, FP8 = torch.bfloat16, torch.float8_e4m3fn


def qkv(seqlen=40, heads=2, heads_k=2, dtype=BF16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(1, seqlen, h, 128, generator=g).to(dtype) for h in (heads, heads_k, heads_k)]


def fp8(seqlen=40, heads=2, heads_k=2):
    return qkv(seqlen, heads, heads_k, FP8), {"q_descale": 0.5, "k_descale": 0.25, "v_descale": 2.0}


# --- numbers by value --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scale", [np.float32(0.125), np.float64(0.125), 0.125, torch.tensor(0.125).item()])
def test_numpy_and_python_numbers_are_taken_by_value(scale):
    q, k, v = qkv()
    expected = flash_attn_func(q, k, v, causal=True, softmax_scale=0.125)
    assert torch.equal(flash_attn_func(q, k, v, causal=np.True_, softmax_scale=scale, dropout_p=np.float64(0),
                                       window_size=(np.int64(-1), np.int64(-1))), expected)


@pytest.mark.parametrize(("scale", "message"), [
    (10**400, "softmax_scale=1000.*overflows float64"),
    (1e39, "softmax_scale=1e\\+39: must be positive and finite, within the float32 range"),
    (np.float64(3e38), "softmax_scale=3e\\+38: must be positive and finite, within the float32 range"),
    (1e-40, "softmax_scale=1e-40: must be positive and finite"),
])
def test_softmax_scale_outside_float32_is_refused(scale, message):
    with pytest.raises(ValueError, match=message):
        flash_attn_func(*qkv(), causal=True, softmax_scale=scale)


def test_numpy_bools_are_bools():
    with pytest.raises(ValueError, match="causal=False"):
        flash_attn_func(*qkv(), causal=np.False_)
    with pytest.raises(TypeError, match="causal must be a bool \\(True\\), got numpy.int64"):
        flash_attn_func(*qkv(), causal=np.int64(1))
    with pytest.raises(TypeError, match="softmax_scale is a bool: this looks like flash-attn 3's positional order"):
        flash_attn_func(*qkv(), 0.0, np.True_)


def test_numpy_integer_max_seqlen_is_taken():
    q, k, v = (t.reshape(40, 2, 128) for t in qkv())
    cu = torch.tensor([0, 40], dtype=torch.int32)
    expected = flash_attn_varlen_func(q, k, v, cu, cu, 40, 40, causal=True)
    assert torch.equal(flash_attn_varlen_func(q, k, v, cu, cu, np.int64(40), np.int32(40), causal=True), expected)
    with pytest.raises(TypeError, match="max_seqlen_q must be an int, got float"):
        flash_attn_varlen_func(q, k, v, cu, cu, 40.0, 40, causal=True)
    with pytest.raises(TypeError, match="max_seqlen_q must be an int, got bool"):
        flash_attn_varlen_func(q, k, v, cu, cu, True, 40, causal=True)


def test_numpy_descales_are_taken_by_value():
    (q, k, v), d = fp8()
    expected = flash_attn_func(q, k, v, causal=True, **d)
    assert torch.equal(flash_attn_func(q, k, v, causal=True, **{n: np.float32(x) for n, x in d.items()}), expected)


# --- the FP32 range ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("descales", "message"), [
    ({"q_descale": 3.4e38}, "q_descale \\* k_descale \\* softmax_scale = .*would overflow float32"),
    ({"q_descale": 2.0**64, "k_descale": 2.0**64}, "would overflow float32; ZYFA covers"),
    ({"v_descale": 1e36}, "v_descale=1e\\+36: outputs up to 448 \\* v_descale would overflow BF16"),
    ({"q_descale": 1e-44}, "q_descale=1e-44: a descale must be a positive, finite, normal float32 value"),
    ({"k_descale": np.float64("nan")}, "k_descale=nan: a descale must be"),
])
def test_descales_outside_the_contract_are_refused(descales, message):
    (q, k, v), d = fp8()
    with pytest.raises(ValueError, match=message):
        flash_attn_func(q, k, v, causal=True, **{**d, **descales})


@pytest.mark.parametrize(("value", "message"), [
    (1e-44, "q_descale holds 9.81e-45: descales must be positive, finite, normal float32 values"),
    (0.0, "q_descale holds 0: descales must be positive"),
    (-1.0, "q_descale holds -1: descales must be positive"),
    (float("inf"), "q_descale holds inf"),
    (3e38, "would overflow float32"),
])
def test_descale_tensor_values_are_checked_on_the_cpu(value, message):
    (q, k, v), d = fp8()
    bad = torch.tensor([[0.5, value]])
    with pytest.raises(ValueError, match=message):
        flash_attn_func(q, k, v, causal=True, **{**d, "q_descale": bad})


def test_bf16_inputs_whose_scores_overflow_float32_are_refused_on_the_cpu():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="q and k: max\\|q\\| \\* max\\|k\\| \\* d_qk .* exceeds the float32 range"):
        flash_attn_func(q * 3e19, k * 3e19, v, causal=True)
    out = flash_attn_func(q * 1e17, k, v, causal=True)  # large but within range: finite results
    assert torch.isfinite(out).all()


def test_bf16_inputs_holding_nan_are_refused_on_the_cpu():
    q, k, v = qkv()
    q[0, 3, 1, 7] = float("nan")
    with pytest.raises(ValueError, match="q or k holds NaN"):
        flash_attn_func(q, k, v, causal=True)


def test_tiny_amax_quantizes_to_zero_with_a_normal_descale():
    """The documented choice: the descale stays a normal float32 (at most 2^126 of scaling), so a tensor whose
    amax is a float32 subnormal like 1e-42 quantizes to zeros (its reconstruction error is at most its amax)."""
    x = torch.full((4, 8), 1e-42)
    x8, descale = fp8_quantize(x)
    assert descale.item() == 2.0**-126 and not x8.float().any()
    small = torch.full((4, 8), 2.0**-120)  # above 2^-135: still represented, with fewer significant bits
    x8, descale = fp8_quantize(small)
    assert torch.equal(x8.float() * descale, small)


# --- p_mode ------------------------------------------------------------------------------------------------------


def test_p_mode_default_on_the_cpu_is_the_contracts_exact():
    (q, k, v), d = fp8()
    default = flash_attn_func(q, k, v, causal=True, return_lse=True, **d)
    exact = flash_attn_func(q, k, v, causal=True, return_lse=True, p_mode="exact", **d)
    lean = flash_attn_func(q, k, v, causal=True, return_lse=True, p_mode="lean", **d)
    assert all(torch.equal(a, b) for a, b in zip(default, exact, strict=True))
    assert not torch.equal(default[0], lean[0])
    model = numerics.attention(q, k, v, p_mode="lean", return_lse=True, **d)
    assert torch.equal(lean[0], model[0]) and torch.equal(lean[1], model[1])


@pytest.mark.parametrize(("p_mode", "dtype", "error", "message"), [
    ("exact", BF16, ValueError, "p_mode='exact' is given but the inputs are BF16"),
    ("bf16", FP8, ValueError, "p_mode='bf16': must be one of \\['exact', 'lean'\\] or None"),
    ("fast", FP8, ValueError, "p_mode='fast'"),
    (1, FP8, TypeError, "p_mode must be a str or None, got int"),
])
def test_bad_p_mode_is_named(p_mode, dtype, error, message):
    q, k, v = qkv(dtype=dtype)
    d = {"q_descale": 1.0, "k_descale": 1.0, "v_descale": 1.0} if dtype == FP8 else {}
    with pytest.raises(error, match=message):
        flash_attn_func(q, k, v, causal=True, p_mode=p_mode, **d)


def test_each_target_has_the_manifests_p_modes():
    assert dispatch.p_modes("gfx950", "fp8e4m3", 128, 128) == ("lean", "exact")  # the default first
    assert dispatch.p_modes("gfx950", "fp8e4m3", 192, 128) == ("exact",)
    assert dispatch.kernel("gfx950", FP8, 128, 128, None, 4096).p_mode == "lean"
    assert dispatch.kernel("gfx950", FP8, 128, 128, "exact", 4096).name == "fp8_d128_exact"
    with pytest.raises(ValueError, match="p_mode='lean': gfx950 has no fp8e4m3 kernel with that p_mode at d_qk=192"):
        dispatch.kernel("gfx950", FP8, 192, 128, "lean", 4096)
    # beyond 32-bit offsets the HIP kernels with 64-bit offsets serve (lean at d = 128); exact P has none there
    assert dispatch.kernel("gfx950", FP8, 128, 128, None, 4096, 2**32).name == "fp8_d128_wide"
    assert dispatch.kernel("gfx950", FP8, 128, 128, None, 4096, 2**32 - 1).name == "fp8_d128"
    with pytest.raises(ValueError, match="inputs span 4294967296 bytes, more than .*32-bit offsets"):
        dispatch.kernel("gfx950", FP8, 128, 128, "exact", 4096, 2**32)
    assert dispatch.head_dims() == tuple(sorted({(k.d_qk, k.d_v) for k in zyfa_kernels.manifest().kernels}))


def _config_from_kernel(fields):
    """The interface zyfa.numerics.config_from_kernel implements (used here only if numerics lacks it)."""
    return numerics.Config(p_mode=fields["p_mode"], block_scale=fields["scale_block"] is not None,
                           rowsum=fields["rowsum"], rescale_threshold=fields["rescale_threshold"],
                           key_tile=fields["tile_n"], scale_block=fields["scale_block"] or fields["tile_n"],
                           p_shift=fields["p_shift"])


def test_reference_forced_on_a_kernel_target_computes_that_kernels_numerics(monkeypatch):
    if not hasattr(numerics, "config_from_kernel"):
        monkeypatch.setattr(numerics, "config_from_kernel", _config_from_kernel, raising=False)
    monkeypatch.setattr(reference, "_kernel_target", lambda device: "gfx950")
    q = torch.zeros(1, 256, 2, 128, dtype=FP8)
    options = reference.numerics_options(q, 128, 256, None)
    kernel = zyfa_kernels.manifest().find("gfx950", name="fp8_d128")
    assert options == dataclasses.asdict(numerics.config_from_kernel(kernel.fields))
    assert (options["p_mode"], options["key_tile"], options["p_shift"]) == ("lean", kernel.tile_n, kernel.p_shift)
    monkeypatch.setattr(reference, "_kernel_target", lambda device: None)
    assert reference.numerics_options(q, 128, 256, None) == {"key_tile": reference.KEY_TILE, "p_mode": "exact"}


# --- strided views -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seqlen", [100, 256, 300])
def test_permuted_and_channels_last_inputs_equal_their_copies(seqlen):
    q, k, v = qkv(seqlen, heads=4, heads_k=2)
    expected = flash_attn_func(q, k, v, causal=True, return_lse=True)
    k_bhds = k.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)  # stored (b, h, d, s), viewed (b, s, h, d)
    assert k_bhds.stride(-1) != 1
    cl = [t.contiguous(memory_format=torch.channels_last) for t in (q, k, v)]
    assert not cl[0].is_contiguous()
    for args in ((q, k_bhds, v), cl):
        got = flash_attn_func(*args, causal=True, return_lse=True)
        assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])


# --- torch.compile -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_compiled_argument_errors_show_zyfas_message_first(dynamic):
    torch._dynamo.reset()
    q, k, v = qkv(16)

    def bad(q):
        return zyfa.flash_attn_func(q, k, v, causal=False)

    with pytest.raises(Exception) as raised:  # noqa: PT011 - dynamo wraps it; its text is what the user reads
        torch.compile(bad, fullgraph=True, backend="aot_eager", dynamic=dynamic)(q)
    first = str(raised.value).strip().splitlines()[0]
    assert first == "ValueError: causal=False: ZYFA computes causal attention only, pass causal=True"
