"""The gfx950 kernels' own paths in the simulator, against the numerics model: the middle query tile of an odd tile
count (a job with tile_lo == tile_hi), the e = 0 fast path (PV accumulates into O directly) and the scaled path
(O += 2^-e * block product), for both head sizes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from asmgen.gfx950 import VARIANTS
from asmgen.sim.attention import manifest_entry, run_attention
from zyfa import numerics
from zyfa_tools import inputs

BF16_MANTISSA_BITS = 7
LSE_TOLERANCE = 1e-5
REL_TOLERANCE = 1e-4  # observed: ~5e-6 (lean P), ~5e-5 (exact P: exp2's last bit moves a few e4m3 roundings)


def fp32_scale(d_qk: int) -> float:
    """The kernels take softmax_scale as FP32: give the model the same value, so c agrees to the last bit."""
    return float(np.float32(d_qk ** -0.5))


def check(name: str, seqlen: int, heads: int, heads_k: int, std: float, data_seed: int = 0, **launch) -> None:
    v, entry = VARIANTS[name], manifest_entry(name)[0]
    q, k, vv = inputs.gaussian(1, seqlen, heads, heads_k, v.d_qk, v.d_v, std=std, seed=data_seed)
    q8, k8, v8, d = inputs.quantize(q, k, vv, torch.float8_e4m3fn)
    descales = (d["q_descale"], d["k_descale"], d["v_descale"])
    scale = fp32_scale(v.d_qk)
    result = run_attention(name, q8, k8, v8, *descales, softmax_scale=scale, **launch)
    model, lse = numerics.attention(q8, k8, v8, q_descale=descales[0], k_descale=descales[1], v_descale=descales[2],
                                    softmax_scale=scale, config=numerics.config_from_kernel(entry), return_lse=True)
    out, ref = result.out.float(), model.float()
    step = torch.exp2(torch.floor(torch.log2(torch.maximum(out.abs(), ref.abs()).clamp_min(1e-30)))
                      - BF16_MANTISSA_BITS)
    assert bool(((out - ref).abs() <= step).all()), f"max |out - model| {(out - ref).abs().max():.3e}"
    torch.testing.assert_close(result.lse, lse, rtol=LSE_TOLERANCE, atol=LSE_TOLERANCE)
    assert ((out - ref).norm() / ref.norm()).item() < REL_TOLERANCE


def test_odd_tile_count_computes_the_middle_tile_once():
    """seqlen 768: jobs (tiles 0 and 2) and (tile 1 alone)."""
    check("fp8_d128", 768, 1, 1, std=1.0)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_uniform_zero_block_exponent_path(name):
    """Small scores (the benchmarks' std 0.1): every block maximum is within a binade of m, so e = 0."""
    check(name, 512, 2, 1, std=0.1, data_seed=1)


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_scaled_block_path(name):
    """Large scores: blocks far below the row maximum get e > 0 and are scaled by 2^-e."""
    check(name, 512, 1, 1, std=2.0, data_seed=2)


def test_wide_head_rings_under_random_interleaving_and_late_loads():
    """d_qk = 192 fills K with 4-byte direct-to-LDS loads (6 per wave): waves interleaved at random, loads landing
    only a few instructions after issue or at the wait."""
    for launch in ({"schedule": "random", "seed": 3}, {"schedule": "greedy", "latency": 3}):
        check("fp8_d192", 512, 2, 2, std=1.0, data_seed=6, **launch)


def test_backend_plan_runs_in_the_simulator_with_bhsd_strides():
    """The dispatch's own plan (bhsd layout, so stride_s = d and stride_h = seqlen * d), packed by the loader's
    argument layout, launched on the persistent grid: the result matches the model."""
    import zyfa_kernels
    from asmgen.sim.machine import load
    from asmgen.sim.memory import Memory
    from zyfa.backends import gfx950 as backend

    kern = zyfa_kernels.manifest().find(target="gfx950", name="fp8_d128")
    batch, seqlen, heads, heads_k = 1, 512, 2, 1
    q, k, v = inputs.gaussian(batch, seqlen, heads, heads_k, kern.d_qk, kern.d_v, std=1.0, seed=4)
    q8, k8, v8, d = inputs.quantize(q, k, v, torch.float8_e4m3fn)
    descales = [d[n].expand(batch, heads_k).contiguous() for n in ("q_descale", "k_descale", "v_descale")]
    bhsd = [t.permute(0, 2, 1, 3).contiguous() for t in (q8, k8, v8)]
    memory = Memory()
    ptrs = [memory.put(t.view(torch.uint8).numpy()) for t in bhsd]
    out = torch.zeros(batch, heads, seqlen, kern.d_v, dtype=torch.bfloat16)
    out_ptr = memory.alloc(out.numel() * out.element_size())
    lse_ptr = memory.alloc(batch * heads * seqlen * 4)
    jobs = backend.host_job_table(batch, heads, seqlen // kern.tile_m, kern.grid_size)
    views = [backend.Operand.of(t, "bhsd") for t in (*bhsd, out)]
    ops = [backend.Operand(p, x.shape, x.strides, x.element_bytes) for p, x in zip([*ptrs, out_ptr], views,
                                                                                    strict=True)]
    plan = backend.plan(kern, *ops, lse_ptr, tuple(memory.put(t.numpy()) for t in descales), memory.put(jobs),
                        len(jobs), fp32_scale(kern.d_qk))
    assert plan.args["q_stride_s"] == kern.d_qk and plan.args["q_stride_h"] == seqlen * kern.d_qk
    kernarg = zyfa_kernels.pack_args(plan.kernel, plan.args)
    program = load(plan.kernel.image())
    program.launch(kern.symbol, plan.grid, (kern.threads, 1, 1), kernarg, memory,
                   workgroups=[(w, 0, 0) for w in range(len(jobs))])
    got = torch.from_numpy(memory.read(out_ptr, out.numel() * 2).view(np.int16).copy()).view(torch.bfloat16)
    got = got.reshape(batch, heads, seqlen, kern.d_v).permute(0, 2, 1, 3)
    lse = torch.from_numpy(memory.read(lse_ptr, batch * heads * seqlen * 4).view(np.float32).copy())
    model, model_lse = numerics.attention(q8, k8, v8, q_descale=descales[0], k_descale=descales[1],
                                          v_descale=descales[2], softmax_scale=fp32_scale(kern.d_qk),
                                          config=numerics.config_from_kernel(kern.fields), return_lse=True)
    assert ((got.float() - model.float()).norm() / model.float().norm()).item() < REL_TOLERANCE
    torch.testing.assert_close(lse.reshape(batch, heads, seqlen), model_lse, rtol=LSE_TOLERANCE, atol=LSE_TOLERANCE)
