"""The sm90a FP8 V^T pre-pass on CPU: its manifest entry against the cubin (the inspect step), the launch plan's
grid and arguments, and the reference permutation the kernel must reproduce bitwise (the GPU check compares)."""

from __future__ import annotations

import pytest
import torch

import zyfa_kernels
from asmgen import build
from asmgen.sm90a import transpose
from zyfa.backends import dispatch, sm90a

FP8 = torch.float8_e4m3fn


def entry():
    return zyfa_kernels.manifest().find("sm90a", kind="transpose_v", dtype="fp8e4m3", d_v=128)


def test_entry_is_the_built_kernel_and_matches_its_cubin():
    k = entry()
    source = transpose.KERNELS[0]
    assert k.kind == "transpose_v" and k.file == f"objects/sm90a/{source['file']}"
    assert {f: k.fields[f] for f in source if f != "file"} == {f: v for f, v in source.items() if f != "file"}
    assert k.threads == k.tile_keys // k.key_group * 32 and k.dynamic_shared_bytes == 0
    assert k.resources["local_bytes"] == 0 and k.resources["stack_bytes"] == 0
    assert k.resources["static_shared_bytes"] == k.shared_bytes == k.tile_keys * k.d_v + transpose.RESERVED_SHARED
    info = transpose.inspect(source, build.PACKAGE / k.file)  # raises unless the args' offsets are the cubin's
    assert info["resources"] == k.resources and k.symbol in info["symbols"]
    assert (transpose, source) in build.target_kernels("sm90a")


def test_attention_lookups_skip_it():
    names = {k.name for k in zyfa_kernels.manifest().kernels}
    assert entry().name not in names and entry() in zyfa_kernels.manifest().objects
    assert (128, 128) in dispatch.head_dims() and all(k.kind == "attention" for k in zyfa_kernels.manifest().kernels)


@pytest.mark.parametrize("seqlen", [1, 16, 127, 128, 1000, 4097])
def test_plan_covers_every_key_tile_head_and_batch(seqlen):
    k = entry()
    shape, strides = (3, seqlen, 2, 128), (seqlen * 256, 256, 128, 1)
    grid, args = sm90a.transpose_plan(k, shape, strides)
    keys = -(-seqlen // 16) * 16
    assert grid == (-(-keys // 128), 2, 3)
    assert args == {"seqlen": seqlen, "keys": keys, "v_stride_b": seqlen * 256, "v_stride_s": 256, "v_stride_h": 128}
    assert set(args) | {"v", "vt"} == set(k.layout.names)
    with pytest.raises(ValueError, match="takes V with head dim 128, contiguous"):
        sm90a.transpose_plan(k, shape, (seqlen * 256, 256, 1, 2))
    with pytest.raises(ValueError, match="at most 65535 batches"):
        sm90a.transpose_plan(k, (70000, seqlen, 2, 128), strides)


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_reference_permutes_each_16_keys_and_pads_with_zeros(layout):
    """Position 4t + 2a + b of each group of 16 holds key 8a + 2t + b; keys past seqlen are zeros."""
    batch, seqlen, heads_k = 2, 37, 3
    codes = torch.randint(1, 120, (batch, seqlen, heads_k, 128), dtype=torch.uint8)
    v = codes.view(FP8)
    given = v if layout == "bshd" else v.transpose(1, 2).contiguous()
    vt = sm90a.transposed_v_reference(given, layout)
    assert vt.shape == (batch, heads_k, 128, 48) and vt.is_contiguous()
    got = vt.view(torch.uint8)
    for position in range(48):
        g, p = divmod(position, 16)
        key = 16 * g + 8 * ((p >> 1) & 1) + 2 * (p >> 2) + (p & 1)
        expected = codes[:, key] if key < seqlen else torch.zeros(batch, heads_k, 128, dtype=torch.uint8)
        assert torch.equal(got[..., position], expected)
    assert torch.equal(sm90a.transposed_v(given, layout), vt)  # on the CPU the reference itself
