"""The committed gfx950 FP8 attention code objects, run in the simulator against the numerics model, and
deliberately broken variants of them caught."""

from __future__ import annotations

import re
from functools import cache

import pytest
import torch

import asmgen.gfx950 as gfx950
import zyfa.numerics as zyfa_numerics
from asmgen.sim import HazardError, SimError
from asmgen.sim.attention import manifest_entry, run_attention
from zyfa_tools import inputs

KERNELS = tuple(sorted(gfx950.VARIANTS))  # fp8_d128 (lean P), fp8_d128_exact, fp8_d192 (exact P)
FAULT_KERNELS = ("fp8_d128", "fp8_d192")  # one per head dim: the faults are independent of the P format
# The kernel differs from the model only in FP32 summation order and exp2's last bits: a few outputs differ by a
# BF16 rounding step, or by more where an exact-P probability lands on the other side of an e4m3 rounding boundary
# (observed: under 1e-4 of the elements, relative error ~3e-5); lse by float32 rounding.
REL_TOLERANCE = 1e-3  # on ||out - model|| / ||model||
DIFFERING_FRACTION = 1e-3  # of the output elements not bitwise equal to the model
LSE_TOLERANCE = 1e-5
FAULT_MIN_ERROR = 0.05  # a broken kernel must be off by far more than REL_TOLERANCE (or raise)


@cache
def problem(kernel: str, kind: str, seqlen: int, heads: int, heads_k: int, seed: int = 0):
    entry, _ = manifest_entry(kernel)
    make = inputs.activation_like if kind == "activation" else inputs.gaussian
    extra = {} if kind == "activation" else {"std": 1.0}
    q, k, v = make(1, seqlen, heads, heads_k, entry["d_qk"], entry["d_v"], seed=seed, **extra)
    q8, k8, v8, d = inputs.quantize(q, k, v, torch.float8_e4m3fn)
    descales = (d["q_descale"], d["k_descale"], d["v_descale"])
    model, lse = zyfa_numerics.attention(q8, k8, v8, q_descale=descales[0], k_descale=descales[1],
                                         v_descale=descales[2], config=zyfa_numerics.config_from_kernel(entry),
                                         return_lse=True)
    return entry, (q8, k8, v8), descales, model, lse


def simulate(kernel, tensors, descales, **kw):
    return run_attention(kernel, *tensors, *descales, **kw)


def compare(entry, result, model, lse) -> float:
    """Assert out and lse agree with the model on the simulated rows at the kernel's tolerance; return the
    relative error."""
    done = result.rows_done(entry["tile_m"])
    assert done.any(), "no job ran"
    rows = done.permute(0, 2, 1)
    out, ref = result.out.float()[rows], model.float()[rows]
    assert torch.isfinite(out).all()
    differing = (out != ref).float().mean().item()
    assert differing < DIFFERING_FRACTION, f"{differing:.2e} of the outputs differ from the model"
    torch.testing.assert_close(result.lse[done], lse[done], rtol=LSE_TOLERANCE, atol=LSE_TOLERANCE)
    rel = ((out - ref).norm() / ref.norm()).item()
    assert rel < REL_TOLERANCE, f"relative error {rel:.2e}"
    return rel


def relative_error(entry, result, model) -> float:
    rows = result.rows_done(entry["tile_m"]).permute(0, 2, 1)
    out, ref = result.out.float()[rows], model.float()[rows]
    return ((out - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("kind,heads,heads_k", [("gaussian", 2, 2), ("activation", 4, 1)])
def test_kernel_matches_numerics_model(kernel, kind, heads, heads_k):
    entry, tensors, descales, model, lse = problem(kernel, kind, 512, heads, heads_k)
    result = simulate(kernel, tensors, descales)
    assert result.stats.workgroups == heads  # one job (a pair of query tiles) per head at seqlen 512
    compare(entry, result, model, lse)


@pytest.mark.parametrize("kernel", FAULT_KERNELS)
def test_workgroups_walk_several_jobs(kernel):
    """264 heads (GQA, 4 per KV head) give 264 jobs on the 256-workgroup persistent grid: workgroups 0-3 run
    2 jobs each, of different heads."""
    entry, tensors, descales, model, lse = problem(kernel, "gaussian", 256, 264, 66)
    result = simulate(kernel, tensors, descales, workgroups=list(range(4)))
    assert len(result.jobs) == 8 and len({tuple(j) for j in result.jobs.tolist()}) == 8
    compare(entry, result, model, lse)


def test_result_does_not_depend_on_wave_interleaving_or_load_latency():
    kernel = "fp8_d128"
    entry, tensors, descales, model, lse = problem(kernel, "activation", 256, 2, 1, seed=3)
    base = simulate(kernel, tensors, descales)
    for kw in ({"schedule": "greedy", "seed": 1}, {"schedule": "random", "seed": 2}, {"latency": 6}):
        other = simulate(kernel, tensors, descales, **kw)
        assert torch.equal(other.out.view(torch.int16), base.out.view(torch.int16)), kw
        assert torch.equal(other.lse, base.lse), kw
    compare(entry, base, model, lse)


@pytest.mark.slow
@pytest.mark.parametrize("kernel,heads", [("fp8_d128", 2), ("fp8_d192", 1)])
def test_kernel_at_seqlen_1k(kernel, heads):
    entry, tensors, descales, model, lse = problem(kernel, "activation", 1024, heads, 1, seed=5)
    result = simulate(kernel, tensors, descales)
    assert len(result.jobs) == 2 * heads  # 4 query tiles: 2 pairs per head
    compare(entry, result, model, lse)


@pytest.mark.parametrize("kernel", ["fp8_d128", "fp8_d128_exact"])
def test_command_line_prints_the_relative_error_last(capsys, kernel):
    from asmgen.sim.__main__ import LAST_LINE, main
    assert main(["run", "--kernel", kernel, "--seqlen", "256", "--heads", "2", "--kv-heads", "1"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    prefix = LAST_LINE.split("{")[0]
    assert last.startswith(prefix)
    assert float(last[len(prefix):]) < REL_TOLERANCE


FAULT_SCHEDULES = {"drop_waitcnt": "round_robin", "bad_lds_offset": "round_robin", "drop_barrier": "greedy"}


@pytest.mark.parametrize("kernel", FAULT_KERNELS)
@pytest.mark.parametrize("fault", sorted(FAULT_SCHEDULES))
def test_fault_injected_variant_is_caught(kernel, fault):
    assert fault in gfx950.FAULTS
    entry, tensors, descales, model, lse = problem(kernel, "gaussian", 256, 2, 1)
    broken = gfx950.assemble(gfx950.generate(kernel, frozenset({fault})))
    assert broken != manifest_entry(kernel)[1]
    try:
        result = simulate(kernel, tensors, descales, entry=entry, code_object=broken,
                          schedule=FAULT_SCHEDULES[fault], seed=0)
    except SimError:
        return  # a hazard or an out-of-range access raised: caught
    assert relative_error(entry, result, model) > FAULT_MIN_ERROR



@pytest.mark.parametrize("padding,match", [
    (r"s_nop ([3-9]|1[0-5])\b",
     r"MFMA hazard \(mfma_write_read\): .*`v_mfma_f32_32x32x64_f8f6f4 .* after \d+ wait states; 20 required"),
    (r"s_nop \d+\b", r"hazard \(valu_vgpr_readlane\): .*`v_lshrrev_b32.*v_readfirstlane_b32.*after 0 wait states; "
                     r"1 required"),
])
def test_kernel_without_its_hazard_padding_raises(padding, match):
    """Remove the generator's s_nop padding (the long MFMA pads, or all of them): the simulator names the pair."""
    kernel = "fp8_d128"
    entry, tensors, descales, _, _ = problem(kernel, "gaussian", 256, 2, 1)
    text = gfx950.generate(kernel)
    stripped = "\n".join(line for line in text.splitlines() if not re.match(r"\s*" + padding, line)) + "\n"
    assert stripped != text
    with pytest.raises(HazardError, match=match):
        simulate(kernel, tensors, descales, entry=entry, code_object=gfx950.assemble(stripped))
