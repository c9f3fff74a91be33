"""The shipped BF16 sm90a kernels are the configurations their manifest entries and the measured choices name, and
their SASS has the structure docs/sm90a.md claims (the plain kernels' softmax left to ptxas, the code-test kernels'
softmax under P V). Needs cuobjdump, like `python -m asmgen.build --check`."""

from __future__ import annotations

import re

import numpy as np
import torch

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


def code_test_forms(entry: dict) -> int:
    """The step forms of a BF16 code-test kernel: kCompactTail's two (the diagonal among them, masked by a flag);
    else two a loop trip and three tails, and kFirstPair's second step of the pair."""
    return 2 if sm90a.CODE_TEST_EDGE[entry["d_qk"]] == "compact_tail" else 6


def code_test_tails(entry: dict) -> int:
    """The sites of a BF16 kernel's last P V: one in a plain kernel; in a code-test kernel one after either step form
    (kCompactTail), or after the first step or the pair, and after each parity's diagonal step (kFirstPair)."""
    if not entry["code_test"]:
        return 1
    return 2 if sm90a.CODE_TEST_EDGE[entry["d_qk"]] == "compact_tail" else 3


def test_config_header_is_the_manifest_entry():
    for entry in sm90a.BF16_KERNELS:
        config = config_of(entry)
        assert config["ZYFA_KERNEL"] == entry["symbol"]
        assert (int(config["kDQk"]), int(config["kDV"]), int(config["kStages"])) == (
            entry["d_qk"], entry["d_v"], entry["stages"])
        assert float(config["kTau"].removesuffix("f")) == entry["rescale_threshold"]
        assert int(config["kDynamicSharedBytes"]) == entry["shared_bytes"] - sm90a.RESERVED_SHARED
        assert config["Schedule"] == {"pingpong": "PingPong", "independent": "Independent"}[entry["schedule"]]
        assert config["kCodeTest"] == ("true" if entry["code_test"] else "false")
        # the per-tile choices: every kernel the lean epilogue, a code-test kernel K first and its head dims' edge
        edge = sm90a.CODE_TEST_EDGE[entry["d_qk"]] if entry["code_test"] else None
        assert [config[k] == "true" for k in ("kLeanEpilogue", "kKFirst", "kCompactTail", "kFirstPair")] == [
            True, entry["code_test"], edge == "compact_tail", edge == "first_pair"], entry["name"]


def test_shipped_kernels_take_the_measured_choices():
    for entry in sm90a.BF16_KERNELS:
        # only the moved-maximum test votes
        voting = entry["code_test"]
        assert (count(sass.instructions(sass.OBJECTS / entry["file"]), "VOTE.ANY") > 0) == voting
    # per head dims: ping-pong from S = 1, ping-pong with the moved-maximum test to any S, their ranges adjoining
    for d_qk in (128, 192):
        kernels = sorted((k for k in sm90a.BF16_KERNELS if k["d_qk"] == d_qk), key=lambda k: k["seqlen_min"] or 0)
        assert [(k["schedule"], k["code_test"]) for k in kernels] == [
            (schedule, code_test) for schedule, code_test, _ in sm90a.BF16_SERVES_FROM[d_qk]]
        first, last = kernels[0], kernels[-1]
        assert (first["schedule"], first["code_test"], first["seqlen_min"]) == ("pingpong", False, None)
        assert (last["schedule"], last["code_test"], last["seqlen_max"]) == ("pingpong", True, None)
        assert all(a["seqlen_max"] == b["seqlen_min"] > (a["seqlen_min"] or 0)
                   for a, b in zip(kernels, kernels[1:], strict=False))


def test_broadcast_index_puts_the_descriptors_in_uniform_registers():
    # with the warpgroup index broadcast, ptxas keeps the wgmma descriptors in uniform registers: fewer R2UR than
    # wgmma instructions in the whole kernel, against more than one per wgmma without it
    for entry in sm90a.KERNELS:
        code = sass.instructions(sass.OBJECTS / entry["file"])
        gemms = sum("GMMA" in c for c in code)
        # (the BF16 code-test kernels without their per-tile choices, variant no_tile_edges, convert them before
        # each wgmma: their second P set leaves ptxas no uniform registers for them; docs/sm90a.md)
        # (the bulk-copy epilogue's loop over the lanes' row addresses, R2UR with a predicate result, aside)
        descriptor_moves = sum("R2UR" in c and not re.search(r"R2UR(\.OR)? P\d", c) for c in code)
        assert descriptor_moves < gemms, entry["name"]


def test_no_shipped_kernel_has_its_wgmmas_serialised():
    for entry in sm90a.KERNELS:
        assert not sass.serialised(sass.instructions(sass.OBJECTS / entry["file"])), entry["name"]


def test_serialised_reads_a_wait_between_every_two_wgmmas():
    gemm, wait = "HGMMA.64x128x16.F32.BF16 R88, gdesc[UR4], R88, gsb0", "WARPGROUP.DEPBAR.LE gsb0, 0x0"
    other = "FMUL R1, R2, R3"
    # a group of wgmmas issued back to back, then waited for: a pipeline
    assert not sass.serialised(["WARPGROUP.ARRIVE", gemm, gemm, other, gemm, wait, other])
    # each alone: ptxas's serialised form
    assert sass.serialised(["WARPGROUP.ARRIVE", gemm, wait, "WARPGROUP.ARRIVE", gemm, wait, other, gemm, wait])
    assert not sass.serialised([gemm, wait]) and not sass.serialised([other])


def test_each_epilogue_stores_o_in_its_form():
    # staged: per warp 16 rows x 128 columns through stmatrix (four 8x8 blocks per instruction), read back and
    # stored 16 bytes per lane; bulk: the same stmatrix, nothing read back, the rows out by bulk copies; the two
    # 4-byte stores left are the log-sum-exp's rows (kLeanEpilogue: under each site of the last P V, of which a
    # code-test loop has two or three, code_test_tails). Direct: 32 4-byte stores of O
    expected = {"staged": (8, 8, 2, False), "bulk": (8, 0, 2, True), "direct": (0, 0, 34, False)}
    for entry in sm90a.KERNELS:
        form = sm90a.epilogue_store(entry["dtype"], entry["p_mode"])
        assert config_of(entry)["kStore"] == {"staged": "Store::kStaged", "bulk": "Store::kBulk",
                                              "direct": "Store::kDirect"}[form]
        code = sass.instructions(sass.OBJECTS / entry["file"])
        stores = (count(code, "STSM.16.M88.4"), count(code, "STG.E.128"), count(code, "STG.E "),
                  count(code, "UBLKCP.G.S") > 0)
        lse_sites = code_test_tails(entry) if entry["dtype"] == "bf16" else 1
        assert stores == (*expected[form][:2], expected[form][2] * lse_sites, expected[form][3]), entry["name"]
    assert {sm90a.epilogue_store(k["dtype"], k["p_mode"]) for k in sm90a.KERNELS} == {"staged", "bulk"}


def test_report_shows_where_the_shipped_kernels_softmax_runs():
    for entry in sm90a.BF16_KERNELS:
        found = sass.steps(sass.instructions(sass.OBJECTS / entry["file"]))
        if entry["code_test"]:
            # two P sets in turn: each step's P is written into the set no P V reads, so ptxas keeps the
            # exponentials of both paths (the test's and the row maxima's) under P V; with kFirstPair the pair's
            # second step comes first, its own 64 under P V (tile 0's ran under the pair's second QK^T); after the
            # wait for P V at most 136 instructions (rescale, release, the next turn), 83-136 as measured
            pair = sm90a.CODE_TEST_EDGE[entry["d_qk"]] == "first_pair"
            assert len(found) == code_test_forms(entry), entry["name"]
            assert all(s.exponentials >= 128 and s.exposed <= 136 for s in found[pair:]), entry["name"]
            assert not pair or (found[0].exponentials == 64 and found[0].exposed < 120), entry["name"]
            continue
        steady, diagonal = found
        # left to ptxas, which sinks the softmax past the wait: only the row maxima stay under P V
        assert steady.exponentials == 0 and steady.under_pv < 100


def test_report_reads_the_fp8_steps_that_wait_for_both_gemms():
    # a steady and a diagonal step each, all exposed: exact P's 64 exponentials of P on each side of the
    # moved-maximum test on the codes (written against m as it stands, and again on the row maxima's path) and 2 of
    # the row factors, lean P's 2 alone
    for entry in sm90a.FP8_KERNELS:
        found = sass.steps(sass.instructions(sass.OBJECTS / entry["file"]))
        assert len(found) == 2 and all(s.under_pv == 0 and s.exposed > 400 for s in found), entry["name"]
        assert {s.exposed_exponentials for s in found} == {2 * 64 + 2 if entry["p_mode"] == "exact" else 2}


def test_report_counts_each_kernels_epilogue_from_its_last_pv_wait_to_os_last_store():
    report = sass.report([sass.OBJECTS / entry["file"] for entry in sm90a.KERNELS]).splitlines()
    for entry in sm90a.KERNELS:
        epilogue = sass.epilogue(sass.instructions(sass.OBJECTS / entry["file"]))
        bulk = sm90a.epilogue_store(entry["dtype"], entry["p_mode"]) == "bulk"
        # the whole store of O: staged, 8 stmatrix and 8 16-byte stores a thread; by bulk copies, 8 stmatrix
        assert epilogue[0] == sass.PV_WAIT and count(epilogue, "STSM") == 8, entry["name"]
        assert count(epilogue, "UBLKCP" if bulk else "STG.E.128") == (1 if bulk else 8), entry["name"]
        (row,) = [line for line in report if line.startswith(f"| {entry['name']} |")]
        assert f"| {len(epilogue)} |" in row


def test_shipped_kernels_use_no_local_memory():
    for entry in sm90a.BF16_KERNELS:
        assert not any(sass.LOCAL_MEMORY.search(c) for c in sass.instructions(sass.OBJECTS / entry["file"]))


def test_the_bf16_moved_maximum_test_misses_no_move():
    """The BF16 moved-maximum test (softmax_bf16.cuh, kCodeTest), emulated: P = bf16(fp32(2^fp32(c s - m))) against
    m as it stands, the halves' unsigned maximum plus 0x8000 - bf16(2^tau); its top bit is set for every row whose
    maximum the model moves (x_max > m + tau in FP32) at both BF16 taus, and for none while x - m stays 0.005 below
    tau."""
    text = (sm90a.SOURCE_DIR / "softmax_bf16.cuh").read_text()
    low, high = (int(x, 16) for x in re.search(r"return C::kTau == 0\.5f \? (0x[0-9a-f]+)u : (0x[0-9a-f]+)u;",
                                                  text).groups())
    rng = np.random.default_rng(2)
    for tau, threshold in ((0.5, low), (8.0, high)):
        assert threshold == int(torch.tensor(2.0**tau).bfloat16().view(torch.int16)) & 0xFFFF
        c = np.float32(0.0883883476 * 1.4426950409)
        s = (rng.standard_normal((4096, 64)) * 4).astype(np.float32)
        x_max = (s.max(axis=1) * c).astype(np.float32)
        m = (x_max - rng.uniform(tau - 0.3, tau + 0.3, size=x_max.shape)).astype(np.float32)
        moved = x_max > (m + np.float32(tau)).astype(np.float32)
        y = (s.astype(np.float64) * c - m[:, None]).astype(np.float32)  # one FMA
        p = torch.from_numpy(np.exp2(y.astype(np.float64)).astype(np.float32)).bfloat16()
        halves = p.view(torch.int16).numpy().astype(np.int64) & 0xFFFF
        fires = ((halves.max(axis=1) + 0x8000 - threshold) & 0x8000) != 0
        assert moved.any() and (~moved).any()
        assert fires[moved].all()
        assert not fires[x_max - m < tau - 0.005].any()


def test_the_bf16_moved_maximum_test_adds_once_after_the_maxima():
    # per test: the 32 P registers' per-half maxima in 15 three-input VIMNMX3.U16x2 and one two-input VIMNMX, then
    # one add of 0x8000 - bf16(2^tau) per half (the entry's tau), not an add and an OR each
    for entry in sm90a.BF16_KERNELS:
        threshold = int(torch.tensor(2.0 ** entry["rescale_threshold"]).bfloat16().view(torch.int16)) & 0xFFFF
        bias = f"{(0x8000 - threshold) * 0x10001:#x}"
        code = sass.instructions(sass.OBJECTS / entry["file"])
        tests = sum(bias in c for c in code)
        if not entry["code_test"]:
            assert tests == count(code, "VIMNMX3.U16x2") == 0, entry["name"]
            continue
        assert tests == code_test_forms(entry), entry["name"]  # one per step form
        assert count(code, "VIMNMX3.U16x2") == 15 * tests and count(code, "VIMNMX.U16x2") == tests, entry["name"]
