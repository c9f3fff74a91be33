"""The sm90a kernel variants the benchmark measures still compile for sm_90a without spills, and the last ones
measured have the structure their docs claim (docs/sm90a.md). Needs nvcc and cuobjdump, like
`python -m asmgen.build --check`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from asmgen import sm90a
from asmgen.sm90a import sass

ROOT = Path(__file__).resolve().parents[2]


PREPARED = ("cross_tile", "q2", "q2_cross_tile", "vote", "no_vote", "speculate", "no_exp", "no_softmax")


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """The variants docs/sm90a.md measured last, built as the benchmark builds them."""
    folder = tmp_path_factory.mktemp("variants")
    subprocess.run([sys.executable, "-m", "benchmarks.sm90a_variants", str(folder), "--only", *PREPARED,
                    "--schedules", "pingpong", "independent"], cwd=ROOT, check=True, capture_output=True)
    return folder, json.loads((folder / "manifest.json").read_text())["kernels"]


def by_suffix(kernels, suffix):
    """The variants named <shipped kernel>_<suffix> (so "vote" does not also match "no_vote")."""
    shipped = {entry["name"] for entry in sm90a.KERNELS}
    return [k for k in kernels if k["name"].endswith(f"_{suffix}") and k["name"].removesuffix(f"_{suffix}") in shipped]


def shipped_code(variant: dict, suffix: str) -> list[str]:
    """SASS of the shipped kernel a variant was built from."""
    return sass.instructions(sass.OBJECTS / f"{variant['name'].removesuffix('_' + suffix)}.cubin")


def count(code: list[str], op: str) -> int:
    return sum(op in c for c in code)


def test_prepared_variants_build_without_local_memory(prepared):
    folder, kernels = prepared
    # every variant for both head dims and schedules, except that a second Q buffer fits only at d = 128, and
    # vote / no_vote only where they differ from the shipped kernel (which votes in VOTE_MAX_KERNELS)
    assert len(kernels) == 4 * 4 + 2 * 2 + 4
    assert {k["d_qk"] for k in by_suffix(kernels, "q2") + by_suffix(kernels, "q2_cross_tile")} == {128}
    assert {(k["d_qk"], k["schedule"]) for k in by_suffix(kernels, "no_vote")} == sm90a.VOTE_MAX_KERNELS
    assert len(by_suffix(kernels, "vote")) == 4 - len(sm90a.VOTE_MAX_KERNELS)
    # the GPU check compares these bit for bit with the shipped kernels
    assert {k["name"] for k in kernels if k["same_results_as_shipped"]} == \
        {k["name"] for suffix in ("vote", "no_vote", "speculate") for k in by_suffix(kernels, suffix)}
    for k in kernels:
        assert k["resources"]["local_bytes"] == 0 and k["resources"]["stack_bytes"] == 0
        assert k["shared_bytes"] <= sm90a.MAX_SHARED
        assert not any(sass.LOCAL_MEMORY.search(c) for c in sass.instructions(folder / k["file"]))


def test_second_q_buffer_is_in_the_layout(prepared):
    _, kernels = prepared
    for k in by_suffix(kernels, "q2"):
        assert k["q_stages"] == 2
        assert k["shared_bytes"] == sm90a.dynamic_shared_bytes(128, 128, q_stages=1) + 128 * 128 * 2 + 2 * 8 \
            + sm90a.RESERVED_SHARED  # one more Q tile and its two barriers


def test_leave_out_variants_drop_what_they_name(prepared):
    folder, kernels = prepared
    for k in by_suffix(kernels, "no_exp"):
        code, base = sass.instructions(folder / k["file"]), shipped_code(k, "no_exp")
        # only the rescale factors' exponentials are left; the GEMMs are the shipped kernel's
        assert count(code, "MUFU.EX2") <= 8 < count(base, "MUFU.EX2")
        assert count(code, "HGMMA") == count(base, "HGMMA")
    for k in by_suffix(kernels, "no_softmax"):
        code, base = sass.instructions(folder / k["file"]), shipped_code(k, "no_softmax")
        assert count(code, "MUFU.EX2") == count(code, "FMNMX") == 0
        assert count(code, "HGMMA") == count(base, "HGMMA")


def test_cross_tile_adds_one_merged_step_with_the_softmax_under_p_v(prepared):
    folder, kernels = prepared
    for k in by_suffix(kernels, "cross_tile"):
        code = sass.instructions(folder / k["file"])
        gemms_per_step = k["d_qk"] // 16 + 128 // 16  # QK^T k-steps + P V k-steps
        shipped = 3 * gemms_per_step  # first QK^T, the steady step and the diagonal step, the last P V
        assert count(code, "HGMMA") == shipped + gemms_per_step
        steady, diagonal, merged = sass.steps(code)
        # the next tile's 64 exponentials (and the two rows' rescale factors) run under this tile's last P V
        assert merged.exponentials == 66


def test_report_shows_the_pinned_softmax_of_the_shipped_kernels():
    for entry in sm90a.BF16_KERNELS:
        steady, diagonal = sass.steps(sass.instructions(sass.OBJECTS / entry["file"]))
        if entry["schedule"] in sm90a.PINNED_SCHEDULES:
            # all exponentials under P V, held there by the K release just before the wait
            assert steady.exponentials == diagonal.exponentials == 66
            assert steady.arrives[-1] == steady.under_pv - 1
        else:  # left to ptxas, which sinks the softmax past the wait: only the row maxima stay under P V
            assert steady.exponentials == 0 and steady.under_pv < 100


def test_shipped_kernels_take_the_measured_choices():
    for entry in sm90a.BF16_KERNELS:
        flags = sm90a.defines(entry)
        pinned = entry["schedule"] in sm90a.PINNED_SCHEDULES
        assert f"-DZYFA_PIN_SOFTMAX={int(pinned)}" in flags and f"-DZYFA_DESC_ADD={int(pinned)}" in flags
        assert "-DZYFA_CROSS_TILE=0" in flags and "-DZYFA_WAIT_HINT=0" in flags and "-DZYFA_DOUBLE_P=0" in flags
        votes = (entry["d_qk"], entry["schedule"]) in sm90a.VOTE_MAX_KERNELS
        assert f"-DZYFA_VOTE_MAX={int(votes)}" in flags and "-DZYFA_SPECULATE=0" in flags
        assert (count(sass.instructions(sass.OBJECTS / entry["file"]), "VOTE.ANY") > 0) == votes


def test_vote_skips_the_quad_reductions_behind_a_warp_vote(prepared):
    folder, kernels = prepared
    voting = [sass.OBJECTS / e["file"] for e in sm90a.BF16_KERNELS
              if (e["d_qk"], e["schedule"]) in sm90a.VOTE_MAX_KERNELS]
    for path in voting + [folder / k["file"] for k in by_suffix(kernels, "vote")]:
        code = sass.instructions(path)
        step = next(i for i, c in enumerate(code) if sass.S_WAIT in c)
        first_exp = next(i for i in range(step, len(code)) if "MUFU.EX2" in code[i])
        body = code[step:first_exp]
        vote = next(i for i, c in enumerate(body) if "VOTE.ANY" in c)
        # the vote, then a branch around the four shuffles (two dependent levels, two rows)
        assert "BRA" in body[vote + 1]
        assert count(body[vote:], "SHFL.BFLY") == 4 and count(body[:vote], "SHFL") == 0


def test_speculate_starts_the_exponentials_before_the_maxima_and_can_compute_s_again(prepared):
    folder, kernels = prepared
    for k in by_suffix(kernels, "speculate"):
        code, base = sass.instructions(folder / k["file"]), shipped_code(k, "speculate")
        # one more QK^T: the slow path of the steady-state step
        assert count(code, "HGMMA") == count(base, "HGMMA") + k["d_qk"] // 16
        step = next(i for i, c in enumerate(code) if sass.S_WAIT in c)
        vote = next(i for i in range(step, len(code)) if "BAR.RED.OR" in code[i])
        fast = code[step:vote]
        # exponentials start before the warpgroup's vote (ptxas places the vote among them: it needs the maxima
        # only), and no quad reduction (shuffle) comes before the vote
        assert count(fast, "MUFU.EX2") >= 16 and count(fast, "SHFL") == 0
