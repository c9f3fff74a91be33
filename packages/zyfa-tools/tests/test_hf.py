"""The transformers integration: "zyfa" and "zyfa-fp8" attention in small random Llama, Mistral and Qwen2 models."""

from __future__ import annotations

import pytest
import torch
import transformers

from zyfa_tools import hf, models
from zyfa_tools.evaluate import kl_divergence

hf.register()


def _ids(seqlen=64, batch=1, seed=0):
    return torch.randint(0, 512, (batch, seqlen), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def llama():
    return models.random_model("llama", key_bias=20.0)


def _logits(model, implementation, ids, **kwargs):
    with torch.no_grad(), hf.use(model, implementation):
        return model(ids, **kwargs).logits


@pytest.mark.parametrize("arch", models.ARCHITECTURES)
def test_load_with_zyfa_fp8_runs_zyfa(arch):
    model = models.random_model(arch, layers=1, attn_implementation="zyfa-fp8")
    assert model.config._attn_implementation == "zyfa-fp8"
    hf.counts.clear()
    ids = _ids()
    with torch.no_grad():
        logits = model(ids).logits
    assert hf.counts == {"zyfa-fp8": 1}
    ref = _logits(model, "sdpa", ids)
    assert 0 < kl_divergence(ref, logits) < 3e-3


def test_bf16_and_fp8_close_to_sdpa(llama):
    ids = _ids(100)
    ref = _logits(llama, "sdpa", ids)
    hf.counts.clear()
    kl_bf16 = kl_divergence(ref, _logits(llama, "zyfa", ids))
    hf.configure(llama, rotation=False, smoothing=False)
    kl_plain = kl_divergence(ref, _logits(llama, "zyfa-fp8", ids))
    hf.configure(llama)
    kl_recipe = kl_divergence(ref, _logits(llama, "zyfa-fp8", ids))
    assert hf.counts == {"zyfa": 2, "zyfa-fp8": 4}
    assert kl_bf16 < 1e-4 and kl_recipe < 2e-3
    assert kl_recipe < kl_plain / 2  # the key offset costs plain FP8 precision; smoothing gives it back


def test_config_attribute_switches_the_implementation(llama):
    ids = _ids(32)
    hf.counts.clear()
    llama.config._attn_implementation = "zyfa"
    try:
        with torch.no_grad():
            llama(ids)
    finally:
        llama.config._attn_implementation = "sdpa"
    assert hf.counts == {"zyfa": 2}


def test_padding_mask_falls_back_to_sdpa_or_raises(llama):
    ids = _ids(32, batch=2)
    mask = torch.ones(2, 32, dtype=torch.long)
    mask[1, :5] = 0  # left padding
    ref = _logits(llama, "sdpa", ids, attention_mask=mask)
    hf.counts.clear()
    out = _logits(llama, "zyfa-fp8", ids, attention_mask=mask)
    assert torch.equal(out, ref)
    assert set(hf.counts) == {"sdpa: attention mask (padding, packed sequences or a masked cache)"}
    hf.configure(llama, fallback="raise")
    try:
        with pytest.raises(ValueError, match="zyfa-fp8 attention cannot run this call: attention mask"):
            _logits(llama, "zyfa-fp8", ids, attention_mask=mask)
    finally:
        hf.configure(llama)
    # an all-ones mask is causal prefill: the sdpa mask builder passes None and ZYFA runs
    hf.counts.clear()
    _logits(llama, "zyfa-fp8", ids, attention_mask=torch.ones(2, 32, dtype=torch.long))
    assert hf.counts == {"zyfa-fp8": 2}


def test_generate_prefills_with_zyfa_and_decodes_with_sdpa(llama):
    ids = _ids(20)
    hf.counts.clear()
    with torch.no_grad(), hf.use(llama, "zyfa-fp8"):
        out = llama.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=0)
    assert out.shape == (1, 23)
    assert hf.counts["zyfa-fp8"] == 2  # the prompt, in both layers
    decode = [key for key in hf.counts if key.startswith("sdpa: 1 queries over")]
    assert sum(hf.counts[key] for key in decode) == 4  # two more tokens, two layers


def test_unsupported_head_dim_raises():
    model = models.random_model("llama", layers=1, head_dim=64)
    with pytest.raises(ValueError, match="head dims d_qk=64, d_v=64; ZYFA supports d_qk = 128, d_v = 128"):
        _logits(model, "zyfa", _ids(16))


def test_configure_checks_its_arguments(llama, tmp_path):
    with pytest.raises(ValueError, match="fallback='never': must be one of"):
        hf.configure(llama, fallback="never")
    with pytest.raises(ValueError, match="no attention modules"):
        hf.configure(torch.nn.Linear(2, 2))


def test_registered_names():
    assert {"zyfa", "zyfa-fp8"} <= set(transformers.AttentionInterface._global_mapping)


def test_pretrained_path_loads_with_zyfa_fp8(tmp_path):
    """The real-weights path: from_pretrained of a saved model with attn_implementation="zyfa-fp8"."""
    saved = models.random_model("qwen2", layers=1)
    saved.save_pretrained(tmp_path)
    model = models.load_model(str(tmp_path), attn_implementation="zyfa-fp8")
    assert model.config._attn_implementation == "zyfa-fp8" and next(model.parameters()).dtype == torch.bfloat16
    hf.counts.clear()
    ids = _ids(40)
    with torch.no_grad():
        logits = model(ids).logits
    assert hf.counts == {"zyfa-fp8": 1}
    assert kl_divergence(_logits(saved, "sdpa", ids), logits) < 3e-3


def test_observe_runs_the_bf16_attention_and_restores_the_implementation():
    model = models.random_model("llama", layers=1, attn_implementation="zyfa-fp8")
    ids = _ids(24)
    seen = []
    hf.counts.clear()
    with torch.no_grad(), hf.observe(model, lambda layer, q, k, v, out, scale: seen.append((layer, out))):
        observed = model(ids).logits
    assert hf.counts == {} and model.config._attn_implementation == "zyfa-fp8"
    assert torch.equal(observed, _logits(model, "sdpa", ids))
    assert [layer for layer, _ in seen] == [0] and seen[0][1].shape == (1, 24, 4, 128)


def test_sliding_window_runs_zyfa_only_within_the_window():
    model = models.random_model("mistral", layers=1)
    model.config.sliding_window = 16
    hf.counts.clear()
    _logits(model, "zyfa-fp8", _ids(12))  # shorter than the window: causal attention, no mask
    assert hf.counts == {"zyfa-fp8": 1}
    hf.counts.clear()
    ids = _ids(40)
    assert torch.equal(_logits(model, "zyfa-fp8", ids), _logits(model, "sdpa", ids))
    assert set(hf.counts) == {"sdpa: attention mask (padding, packed sequences or a masked cache)"}
