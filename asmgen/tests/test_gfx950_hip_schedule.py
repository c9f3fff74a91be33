"""The static schedule model of the HIP kernels' key loop (asmgen.gfx950.hip_schedule) and the figures it reports
for the committed objects, with those of the assembly kernels (asmgen.gfx950.schedule)."""

from __future__ import annotations

from functools import cache

import pytest

import asmgen.gfx950 as gfx950
from asmgen import hip
from asmgen.gfx950 import hip_schedule, schedule

SEQLEN = 768  # 3 query tiles: tile 2 gives wave 0 eight key tiles below its rows, enough for two steady iterations


@cache
def analysis(kernel: str) -> hip_schedule.Analysis:
    return hip_schedule.analyse(kernel, SEQLEN)


def test_listing_finds_the_key_loop_in_clangs_assembly():
    for kernel in ("bf16_d128", "bf16_d192"):
        lst = hip_schedule.listing(hip.generate(kernel))
        loop = [lst.mnemonics[i] for i in sorted(lst.loop)]
        assert "v_mfma_f32_32x32x16_bf16" in loop and "s_barrier" in loop and lst.header in lst.loop
        assert len(lst.loop) < len(lst.lines) / 2  # one loop of the two query tiles' copies, not the kernel


@pytest.mark.parametrize("kernel,matrix,barriers,busy", [
    ("bf16_d128", 32 * 8 * 4, 2, 0.856),  # 16 QK + 16 PV MFMAs of 8 passes per tile; ping-pong: 2 barriers
    ("bf16_d192", 40 * 8 * 4, 8, 0.639),  # 24 QK + 16 PV MFMAs; the 8-stage pipeline: 8 barriers per tile
])
def test_steady_state_figures(kernel, matrix, barriers, busy):
    result = analysis(kernel)
    steady = result.cases["no rescale"]
    for wave in (steady.a, steady.b):
        assert wave.matrix == matrix
        assert wave.counts["exp"] == hip_schedule.EXPS_PER_TILE  # p = 2^(x - m): no rescale, no mask
        assert wave.counts["barrier"] == barriers
    assert steady.matrix_cycles == 2 * matrix
    assert steady.matrix_busy == pytest.approx(busy, abs=5e-4)
    assert result.rescale["exp"] == 1 and result.rescale_cycles > 0  # 2^(m_old - m) and the O, l multiplies


def test_two_score_tiles_hide_nothing_the_model_charges():
    """The interval model: no interval is shorter than either wave's own issue or the shared pipes' demand."""
    steady = analysis("bf16_d128").cases["no rescale"]
    assert steady.interval_cycles >= max(steady.a.other, steady.b.other, steady.matrix_cycles)


def test_assembly_kernel_figures():
    """The figures docs/gfx950.md states for the FP8 assembly kernels' key loop."""
    cases = {name: [schedule.analyse(gfx950.generate(name), **kw).matrix_busy
                    for kw in ({}, {"scaled_pv": True}, {"scaled_pv": True, "negative_e": True},
                               {"scaled_pv": True, "negative_e": True, "with_rescale": True})]
             for name in ("fp8_d128", "fp8_d128_exact", "fp8_d192")}
    assert [round(100 * b, 1) for b in cases["fp8_d128"]] == [100.0, 86.8, 79.6, 64.6]
    assert cases["fp8_d128"][1] >= 0.86  # the seed's figure, on the path where some e > 0
    assert [round(100 * b, 1) for b in cases["fp8_d128_exact"][:2]] == [59.9, 49.5]
    assert [round(100 * b, 1) for b in cases["fp8_d192"][:2]] == [72.0, 59.6]
