"""Small randomly initialised causal LMs built from a config (no weights are downloaded), and loading real ones.

`random_model("llama")` is a Llama-architecture model at head_dim 128 small enough for the CPU reference path;
"mistral" and "qwen2" (q/k/v biases) are the other attention styles the integration supports. Random weights
give nearly uniform attention and no outlier channels; `key_bias` adds what real models have and FP8 suffers
from: a large constant per-channel key offset (the k_proj bias, spread over `key_bias_channels` channels per
head), the case K smoothing and rotation are for.
"""

from __future__ import annotations

import torch

ARCHITECTURES = ("llama", "mistral", "qwen2")


def random_model(arch: str = "llama", *, layers: int = 2, heads: int = 4, kv_heads: int = 2, head_dim: int = 128,
                 hidden: int = 256, vocab: int = 512, seed: int = 0, key_bias: float = 0.0,
                 key_bias_channels: int = 4, max_positions: int = 4096, dtype=torch.bfloat16,
                 attn_implementation: str = "sdpa"):
    """A randomly initialised causal LM (transformers) of architecture `arch`, in eval mode (max_positions: the
    config's max_position_embeddings, at least the longest sequence it will run)."""
    import transformers

    if arch not in ARCHITECTURES:
        raise ValueError(f"arch={arch!r}: must be one of {ARCHITECTURES}")
    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
                  max_position_embeddings=max_positions, initializer_range=0.05, tie_word_embeddings=False)
    if arch == "llama":
        config = transformers.LlamaConfig(attention_bias=key_bias != 0, **common)
    elif arch == "mistral":
        config = transformers.MistralConfig(sliding_window=None, **common)
    else:
        config = transformers.Qwen2Config(**common)
    config._attn_implementation = attn_implementation
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation)
    if key_bias:
        _add_key_bias(model, key_bias, key_bias_channels, seed)
    return model.to(dtype).eval()


def _add_key_bias(model, size: float, channels: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed + 1)
    for layer in model.model.layers:
        proj = layer.self_attn.k_proj
        if proj.bias is None:
            raise ValueError(f"{type(model).__name__} has no k_proj bias: build it with attention_bias=True")
        head_dim = layer.self_attn.head_dim
        bias = torch.zeros(proj.out_features)
        for h in range(proj.out_features // head_dim):
            picked = torch.randperm(2 * channels, generator=gen)[:channels]  # among the lowest rotary frequencies
            bias[h * head_dim + head_dim // 2 - 1 - picked] = size * (torch.rand(channels, generator=gen) + 0.5)
        with torch.no_grad():
            proj.bias.copy_(bias)


def load_model(name_or_path: str, *, dtype=torch.bfloat16, attn_implementation: str = "sdpa"):
    """A pretrained causal LM from a local path or a hub id (weights the user has), in eval mode."""
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(
        name_or_path, dtype=dtype, attn_implementation=attn_implementation).eval()
