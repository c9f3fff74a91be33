"""The shipped BF16 sm90a kernels are the configurations their manifest entries and the measured choices name, and
their SASS has the structure docs/sm90a.md claims (the pinned softmax, the vote on the row maxima). Needs cuobjdump,
like `python -m asmgen.build --check`."""

from __future__ import annotations

import re

from asmgen import sm90a
from asmgen.sm90a import sass


def count(code: list[str], op: str) -> int:
    return sum(op in c for c in code)


def config_of(entry: dict) -> dict[str, str]:
    """The Config fields of a kernel's generated header: name -> value as written."""
    header = sm90a.config_header(entry)
    fields = dict(re.findall(r"static constexpr \w+ (\w+) = ([^;]+);", header))
    fields["Schedule"] = re.search(r"using Schedule = (\w+);", header).group(1)
    fields["ZYFA_KERNEL"] = re.search(r"#define ZYFA_KERNEL (\w+)", header).group(1)
    return fields


def test_config_header_is_the_manifest_entry():
    for entry in sm90a.BF16_KERNELS:
        config = config_of(entry)
        assert config["ZYFA_KERNEL"] == entry["symbol"]
        assert (int(config["kDQk"]), int(config["kDV"]), int(config["kStages"])) == (
            entry["d_qk"], entry["d_v"], entry["stages"])
        assert float(config["kTau"].removesuffix("f")) == entry["rescale_threshold"]
        assert int(config["kDynamicSharedBytes"]) == entry["shared_bytes"] - sm90a.RESERVED_SHARED
        assert config["Schedule"] == {"pingpong": "PingPong", "independent": "Independent"}[entry["schedule"]]


def test_shipped_kernels_take_the_measured_choices():
    for entry in sm90a.BF16_KERNELS:
        config = config_of(entry)
        pinned = entry["schedule"] in sm90a.PINNED_SCHEDULES
        assert config["kPinSoftmax"] == ("true" if pinned else "false")
        votes = (entry["d_qk"], entry["schedule"]) in sm90a.VOTE_MAX_KERNELS
        assert config["kVoteMax"] == ("true" if votes else "false")
        assert (count(sass.instructions(sass.OBJECTS / entry["file"]), "VOTE.ANY") > 0) == votes


def test_broadcast_index_puts_the_descriptors_in_uniform_registers():
    # with the warpgroup index broadcast, ptxas keeps the wgmma descriptors in uniform registers: fewer R2UR than
    # wgmma instructions in the whole kernel, against more than one per wgmma without it
    for entry in sm90a.KERNELS:
        config = config_of(entry)
        broadcasts = (entry["dtype"], entry["d_qk"], entry["schedule"]) not in sm90a.SCATTERED_INDEX_KERNELS
        assert config["kBroadcastIndex"] == ("true" if broadcasts else "false")
        code = sass.instructions(sass.OBJECTS / entry["file"])
        gemms = sum("GMMA" in c for c in code)
        assert (count(code, "R2UR") < gemms) == broadcasts, entry["name"]


def test_staged_epilogues_store_o_in_whole_rows():
    # staged: per warp 16 rows x 128 columns through stmatrix (four 8x8 blocks per instruction), read back and
    # stored 16 bytes per lane; the two 4-byte stores left are the log-sum-exp's rows. Direct: 32 4-byte stores of O
    for entry in sm90a.KERNELS:
        staged = sm90a.staged_store(entry["dtype"], entry["p_mode"])
        assert config_of(entry)["kStagedStore"] == ("true" if staged else "false")
        code = sass.instructions(sass.OBJECTS / entry["file"])
        stores = (count(code, "STSM.16.M88.4"), count(code, "STG.E.128"), count(code, "STG.E "))
        assert stores == ((8, 8, 2) if staged else (0, 0, 34)), entry["name"]
    assert {(k["dtype"], k["p_mode"]) for k in sm90a.KERNELS} > sm90a.DIRECT_STORE_KERNELS


def test_report_shows_the_pinned_softmax_of_the_shipped_kernels():
    for entry in sm90a.BF16_KERNELS:
        steady, diagonal = sass.steps(sass.instructions(sass.OBJECTS / entry["file"]))
        if entry["schedule"] in sm90a.PINNED_SCHEDULES:
            # all exponentials under P V, held there by the K release just before the wait
            assert steady.exponentials == diagonal.exponentials == 66
            assert steady.arrives[-1] == steady.under_pv - 1
        else:  # left to ptxas, which sinks the softmax past the wait: only the row maxima stay under P V
            assert steady.exponentials == 0 and steady.under_pv < 100


def test_report_reads_the_fp8_steps_that_wait_for_both_gemms():
    # a steady and a diagonal step each, all exposed: exact P's 64 exponentials of P on each side of the
    # moved-maximum test on the codes (written against m as it stands, and again on the row maxima's path) and 2 of
    # the row factors, lean P's 2 alone
    for entry in sm90a.FP8_KERNELS:
        found = sass.steps(sass.instructions(sass.OBJECTS / entry["file"]))
        assert len(found) == 2 and all(s.under_pv == 0 and s.exposed > 400 for s in found), entry["name"]
        assert {s.exposed_exponentials for s in found} == {2 * 64 + 2 if entry["p_mode"] == "exact" else 2}


def test_vote_skips_the_quad_reductions_behind_a_warp_vote():
    for entry in sm90a.BF16_KERNELS:
        if (entry["d_qk"], entry["schedule"]) not in sm90a.VOTE_MAX_KERNELS:
            continue
        code = sass.instructions(sass.OBJECTS / entry["file"])
        step = next(i for i, c in enumerate(code) if sass.S_WAIT in c)
        first_exp = next(i for i in range(step, len(code)) if "MUFU.EX2" in code[i])
        body = code[step:first_exp]
        vote = next(i for i, c in enumerate(body) if "VOTE.ANY" in c)
        # the vote, then a branch around the four shuffles (two dependent levels, two rows)
        assert "BRA" in body[vote + 1]
        assert count(body[vote:], "SHFL.BFLY") == 4 and count(body[:vote], "SHFL") == 0


def test_shipped_kernels_use_no_local_memory():
    for entry in sm90a.BF16_KERNELS:
        assert not any(sass.LOCAL_MEMORY.search(c) for c in sass.instructions(sass.OBJECTS / entry["file"]))
