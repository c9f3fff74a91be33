"""The measurement variants of asmgen/sm90a/experiments build from the shipped kernels' configurations with one
choice changed, and none equal to its shipped kernel is built. Needs nvcc and cuobjdump, like
`python -m asmgen.build --check`."""

from __future__ import annotations

import importlib.util
import itertools
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from asmgen import sm90a
from asmgen.sm90a import experiments, sass
from zyfa.jobs import balanced_jobs, cta_tiles


def test_independent_variants_rebuild_the_bf16_kernels_without_turns(tmp_path):
    entries = experiments.build_variants(tmp_path, ["independent"], ["bf16"])
    # every BF16 kernel (all ping-pong), without the named barriers of the turns
    assert {e["name"] for e in entries} == {f"{k['name']}_independent" for k in sm90a.BF16_KERNELS}
    for entry in entries:
        assert entry["schedule"] == "independent" and entry["same_results_as_shipped"]
        assert entry["resources"]["local_bytes"] == 0
        code = sass.instructions(tmp_path / entry["file"])
        assert not any("BAR.ARV" in c for c in code)
        assert not any(sass.LOCAL_MEMORY.search(c) for c in code)
    # a second build into the same folder adds its variants to the first's
    added = experiments.build_variants(tmp_path, ["direct"], ["bf16"])
    listed = {e["name"] for e in json.loads((tmp_path / "manifest.json").read_text())["kernels"]}
    assert added and listed == {e["name"] for e in entries + added}


def test_the_kept_patches_apply_to_the_current_sources():
    # the variants kept as patches must still apply (git apply --check changes nothing)
    root = Path(experiments.__file__).resolve().parents[3]
    for patch in sorted(Path(experiments.__file__).parent.glob("*.patch")):
        result = subprocess.run(["git", "apply", "--check", str(patch)], cwd=root, capture_output=True, text=True)
        assert result.returncode == 0, f"{patch.name}: {result.stderr}"


def test_epilogue_variants_take_another_store(tmp_path):
    # each store form (STORES) a kernel does not ship and whose staging fits its shared memory
    forms = {"direct": "direct", "staged": "staged", "bulk_store": "bulk"}
    entries = experiments.build_variants(tmp_path, list(forms))
    shipped = {k["name"]: sm90a.epilogue_store(k["dtype"], k["p_mode"]) for k in sm90a.KERNELS}
    expected = {f"{k['name']}_{suffix}" for k in sm90a.KERNELS for suffix, form in forms.items()
                if k["p_mode"] in experiments.VARIANTS[k["dtype"]].get(suffix, ({}, {}, ()))[2]
                and form != shipped[k["name"]] and sm90a.shared_bytes(k, form) <= sm90a.MAX_SHARED}
    assert {e["name"] for e in entries} == expected
    assert "sm90a_fwd_bf16_d192_128_pingpong_bulk_store" not in expected  # its staging does not fit
    for entry in entries:
        form = next(form for suffix, form in forms.items() if entry["name"].endswith(f"_{suffix}"))
        assert entry["same_results_as_shipped"] and entry["resources"]["local_bytes"] == 0
        assert entry["shared_bytes"] == sm90a.shared_bytes(entry, form) <= sm90a.MAX_SHARED
        code = sass.instructions(tmp_path / entry["file"])
        assert (sum("STSM.16.M88.4" in c for c in code) == 8) == (form != "direct")
        assert any("UBLKCP.G.S" in c for c in code) == (form == "bulk")
        assert any("LDS.128" in c for c in code) == (form == "staged")


def test_the_transpose_v_smem_patch_builds_fp8_variants_that_read_v_as_stored(tmp_path):
    # every FP8 kernel: V's tensor map instead of V^T's, the ldmatrix.trans / stmatrix loop, no local memory, and
    # shared memory within the limit (the raw V slots)
    entries = experiments.build_patched(tmp_path, "transpose_v_smem.patch", ["vt_smem"], ["fp8e4m3"])
    # a raw V slot and its two barriers per ring slot: beside the staged epilogue, exact P at d_qk = 192 does not fit
    raw_v = {k["name"]: k["stages"] * (sm90a.TILE_N * k["d_v"] + 2 * sm90a.BARRIER_BYTES) for k in sm90a.FP8_KERNELS}
    fitting = {k["name"] for k in sm90a.FP8_KERNELS if k["shared_bytes"] + raw_v[k["name"]] <= sm90a.MAX_SHARED}
    assert {k["name"] for k in sm90a.FP8_KERNELS} - fitting == {"sm90a_fwd_fp8_d192_128_independent"}
    assert {e["name"] for e in entries} == {f"{name}_vt_smem" for name in fitting}
    for entry in entries:
        assert not entry["v_transposed"] and entry["args"][2]["name"] == "v"
        assert entry["resources"]["local_bytes"] == 0 and entry["shared_bytes"] <= sm90a.MAX_SHARED
        code = sass.instructions(tmp_path / entry["file"])
        # the loop over a key group's four pairs of dim chunks is unrolled by two (the staged and bulk epilogues
        # add 8 STSM)
        staging = 8 if sm90a.epilogue_store(entry["dtype"], entry["p_mode"]) != "direct" else 0
        assert sum("LDSM.16.MT88.4" in c for c in code) == 2 and sum("STSM.16.M88.4" in c for c in code) == 2 + staging


def test_a_patch_only_variant_without_its_patch_is_refused_by_name(tmp_path):
    run = subprocess.run([sys.executable, "-m", "asmgen.sm90a.experiments", str(tmp_path), "--only", "vt_smem"],
                         capture_output=True, text=True)
    assert run.returncode == 2 and "--only vt_smem: not a variant of the unpatched sources" in run.stderr
    assert "--patch" in run.stderr


def test_the_timing_patch_builds_timed_fp8_variants_whose_sums_the_reader_averages(tmp_path):
    from asmgen.sm90a.experiments import timing

    entries = experiments.build_patched(tmp_path, "timing.patch", ["timed", "timed_pingpong", "timed_fine"],
                                        ["fp8e4m3"])
    # exact P in both schedules, lean P in the one it ships (ping-pong), at both head dims; the fine laps for exact P
    assert {(e["p_mode"], e["schedule"]) for e in entries} == {("exact", "independent"), ("exact", "pingpong"),
                                                                ("lean", "pingpong")}
    assert len(entries) == 8
    laps = {}
    for entry in entries:
        assert entry["timed"] and entry["resources"]["local_bytes"] == 0
        code = sass.instructions(tmp_path / entry["file"])
        laps[entry["name"]] = sum("SR_CLOCKLO" in c for c in code)
        assert laps[entry["name"]] >= 10  # the laps of the first tile, the steps and the last P V
    # three laps more in each of the two step instances (steady, diagonal): before the exponentials, after them (the
    # packing with them, under the moved-maximum test on the codes) and after that test
    for d in ("d128", "d192_128"):
        assert laps[f"sm90a_fwd_fp8_{d}_independent_timed_fine"] == laps[f"sm90a_fwd_fp8_{d}_independent_timed"] + 6
    # two CTAs: consumer warp 0 of each warpgroup, 10 steps, the phases in the patch's order
    phases = len(timing.PHASES)
    sums = [0] * (2 * timing.CONSUMER_WARPS * phases)
    for cta, scale in ((0, 1), (1, 3)):
        for consumer in (0, 1):
            base = (cta * timing.CONSUMER_WARPS + 4 * consumer) * phases
            sums[base:base + 4] = [100 * scale, 200 * scale, 300 * scale, (1000 + consumer) * scale]
            sums[base + timing.PHASES.index("steps")] = 10
            sums[base + timing.PHASES.index("epilogue")] = 500 * scale
            sums[base + timing.PHASES.index("total")] = 10000 * scale
    rows = timing.per_step(sums, grid=2)
    assert [row["consumer"] for row in rows] == [0, 1]
    assert rows[0]["kv_wait"] == 20 and rows[0]["softmax"] == 200 and rows[1]["softmax"] == 200.2
    assert rows[0]["epilogue_share"] == 0.05 and rows[0]["q_wait_share"] == 0


def test_the_timing_patch_builds_timed_bf16_variants_whose_laps_bound_the_p_v_wait(tmp_path):
    from asmgen.sm90a.experiments import timing

    entries = experiments.build_patched(tmp_path, "timing.patch", ["timed"], ["bf16"])
    # every BF16 kernel, the d_qk = 192 code-test one too: its sums but the step's leave the registers per tile
    assert {e["name"] for e in entries} == {f"{k['name']}_timed" for k in sm90a.BF16_KERNELS}
    for entry in entries:
        assert entry["timed"] and entry["resources"]["local_bytes"] == 0
        code = [c for c in sass.instructions(tmp_path / entry["file"]) if not c.startswith("NOP")]
        waits = [i for i, c in enumerate(code) if sass.S_WAIT in c]
        # laps around the P V wait where the softmax is held ahead of it (the moved-maximum test); none just before
        # it where ptxas sinks the softmax past it
        ahead = entry["code_test"]
        for wait in waits:
            pv_wait = next(i for i in range(wait + 1, len(code)) if sass.PV_WAIT in code[i])
            assert ("SR_CLOCKLO" in code[pv_wait - 1]) == ahead
        # from one step's S wait to the next, one clock read per lap: no lap's time read again later
        assert sum("SR_CLOCKLO" in c for c in code[waits[0]:waits[1]]) == (6 if ahead else 5)
    # two CTAs: consumer warp 0 of each warpgroup, 10 steps; BF16's P V wait and tail in two of FP8's fine slots
    slots = timing.SLOTS["bf16"]
    sums = [0] * (2 * timing.CONSUMER_WARPS * len(slots))
    for cta, scale in ((0, 1), (1, 3)):
        for consumer in (0, 1):
            base = (cta * timing.CONSUMER_WARPS + 4 * consumer) * len(slots)
            for phase, cycles in (("kv_wait", 100), ("gemm_wait", 300), ("pv_wait", 400), ("tail", 500 + consumer)):
                sums[base + slots.index(phase)] = cycles * scale
            sums[base + slots.index("steps")] = 10
    rows = timing.per_step(sums, grid=2, dtype="bf16")
    assert rows[0]["kv_wait"] == 20 and rows[0]["pv_wait"] == 80 and rows[1]["tail"] == 100.2
    assert rows[0]["pre"] == rows[0]["packing"] == 0  # FP8's fine parts: no BF16 phase
    assert timing.per_step(sums, grid=2)[0]["pre"] == 80  # the same slot read as FP8's


def test_the_alternate_patch_puts_each_steps_exponentials_inside_a_turn(tmp_path):
    entries = experiments.build_patched(tmp_path, "alternate.patch", ["alternate"], ["fp8e4m3"])
    assert {(e["p_mode"], e["d_qk"]) for e in entries} == {(p, d) for p in ("exact", "lean") for d in (128, 192)}
    for entry in entries:
        assert entry["schedule"] == "alternate" and entry["same_results_as_shipped"]
        assert entry["resources"]["local_bytes"] == 0
        if entry["p_mode"] != "exact":
            continue
        code = sass.instructions(tmp_path / entry["file"])
        waits = [i for i, c in enumerate(code) if sass.PV_WAIT in c]
        for wait, following in zip(waits[:-1], waits[1:], strict=True):
            body = code[wait + 1:following]
            first_exp = next((i for i, c in enumerate(body) if "MUFU.EX2" in c), None)
            if first_exp is None:  # the epilogue's wait: no softmax follows
                continue
            # the turn is taken after the GEMM wait and before the first exponential, given back after the issue
            assert any("BAR.SYNC" in c for c in body[:first_exp])
            assert sum("BAR.ARV" in c for c in body[first_exp:]) <= 1


def test_the_trio_patch_builds_three_consumer_fp8_variants_whose_key_loop_keeps_to_registers(tmp_path, monkeypatch):
    monkeypatch.setenv("ZYFA_ALLOW_SPILLS", "1")  # the epilogue's few spills (the patch says so)
    entries = experiments.build_patched(tmp_path, "trio.patch", ["trio"], ["fp8e4m3"])
    assert {(e["p_mode"], e["d_qk"]) for e in entries} == {(p, d) for p in ("exact", "lean") for d in (128, 192)}
    for entry in entries:
        assert (entry["tile_m"], entry["threads"]) == (192, 512) and entry["same_results_as_shipped"]
        assert entry["shared_bytes"] <= sm90a.MAX_SHARED
        addresses, code = zip(*sass.functions(tmp_path / entry["file"])[entry["symbol"]], strict=True)
        # three consumer warpgroups of 160 registers beside a producer of 24
        assert any("USETMAXREG.TRY_ALLOC" in c and "0xa0" in c for c in code)
        assert any("USETMAXREG.DEALLOC" in c and "0x18" in c for c in code)
        # the key loop (the innermost backward branch around GEMMs) has no local memory
        step_gemms = entry["d_qk"] // 32 + sm90a.TILE_N // 32  # QK^T and P V, k = 32 each
        loops = []
        for i, c in enumerate(code):
            target = re.search(r"BRA (0x[0-9a-f]+)", c)
            if target and int(target.group(1), 16) < addresses[i]:
                body = code[addresses.index(int(target.group(1), 16)):i]
                if sum("QGMMA" in b for b in body) >= step_gemms:
                    loops.append(body)
        key_loop = min(loops, key=len)
        assert sum("QGMMA" in c for c in key_loop) == step_gemms
        assert not any(sass.LOCAL_MEMORY.search(c) for c in key_loop)


def test_each_microbenchmark_loop_holds_the_instructions_it_measures(tmp_path):
    from asmgen.sm90a.experiments import microbench

    microbench.build(tmp_path)  # raises where a loop and its claim differ
    mixes = microbench.loop_mixes(tmp_path / "pipes.cubin")
    assert microbench.count(mixes["pipe_ex2"], "MUFU.EX2") == 8
    assert microbench.count(mixes["pipe_ex2"], "FMNMX") == 0
    step = microbench.loop_mixes(tmp_path / "softmax_alone.cubin")["softmax_all"]
    assert microbench.count(step, "FFMA") == 64 and microbench.count(step, "HADD2") > 0  # the whole step
    ceiling = microbench.loop_mixes(tmp_path / "gemm_ceiling.cubin")  # the step's GEMMs, one step per trip
    assert microbench.count(ceiling["ceiling_fp8"], "QGMMA") == 8
    assert microbench.count(ceiling["ceiling_bf16"], "HGMMA") == 16
    # QK^T in two N = 64 halves: twice the wgmmas for the same FLOP, one wait per step as unsplit
    assert microbench.count(ceiling["ceiling_bf16_split"], "HGMMA.64x64x16") == 16
    assert microbench.count(ceiling["ceiling_fp8_split"], "QGMMA.64x64x32") == 8
    assert all(microbench.count(ceiling[k], "WARPGROUP.DEPBAR") == 1 for k in ceiling)
    # beside the steps, the second warpgroup's loop: two commit groups a trip (two accumulators), each waited down to
    # the groups the way of issuing leaves in flight, and no wait between the wgmmas of a group
    beside = sass.functions(tmp_path / "softmax_alone.cubin")
    for issue, wgmmas in microbench.BESIDE.items():
        for step in ("softmax", "softmax_bf16"):
            code = [text for _, text in beside[f"{step}_beside_{issue}"]]
            waits = [re.search(r"gsb0, (0x\d)", c).group(1) for c in code if "WARPGROUP.DEPBAR" in c]
            assert _count(code, r"\bQGMMA\b") == 2 * wgmmas
            assert waits == ([] if not wgmmas else ["0x0"] * 3 if issue == "gemm" else ["0x1", "0x1", "0x0"])
    # and the check can fail: a claim that a loop does not hold is reported by kernel
    problems = microbench.check(tmp_path / "pipes.cubin", {"pipe_ex2": {"FMNMX": 8}, "pipe_missing": {}})
    assert [p.split(":")[0] for p in problems] == ["pipe_ex2", "pipe_missing"]


GEMM = r"\b[HQ]GMMA\b"  # a wgmma: BF16 or FP8 operands
REGISTER_A = re.compile(r"[HQ]GMMA\.\S+ R\d+, R\d+, gdesc")  # a P V: A (P) from registers
O_STORES = r"STSM|STG\.E\.128|UBLKCP"  # O's staged or bulk stores (epilogue.cuh)


def _count(code: list[str], pattern: str) -> int:
    """Instructions of `code` (sass.instructions) that `pattern` matches."""
    return sum(re.search(pattern, c) is not None for c in code)


def _codes(folder: Path, entry: dict, variant: str) -> tuple[dict, list[str], list[str]]:
    """The shipped kernel a variant `<kernel>_<variant>` of `folder` was built from (its manifest entry), and the
    variant's and that kernel's instructions."""
    base = next(k for k in sm90a.KERNELS if k["name"] == entry["name"].removesuffix(f"_{variant}"))
    return base, sass.instructions(folder / entry["file"]), sass.instructions(sass.OBJECTS / base["file"])


def _key_loop(code: list[str]) -> list[str]:
    """The instructions of the smallest loop (a backward branch's span) that holds two S waits: the code-test
    kernels' key-tile loop (its two step forms), the other BF16 kernels' query-tile loop."""
    spans = []
    for i, c in enumerate(code):
        target = re.search(r"\bBRA (?:\S+, )?0x([0-9a-f]+)", c)
        start = int(target.group(1), 16) // 16 if target else i  # 16 bytes an instruction
        if start < i and _count(code[start:i], r"DEPBAR\.LE gsb0, 0x1") >= 2:
            spans.append((i - start, start, i))
    _, start, end = min(spans)
    return code[start:end + 1]


def _waits_next(code: list[str], i: int) -> bool:
    """Whether the next wgmma or wgmma wait after instruction i is a wait (a group issued alone, not one issued
    with the next)."""
    return "DEPBAR" in next(c for c in code[i + 1:] if re.search(r"GMMA|WARPGROUP\.DEPBAR", c))


def _waits_for_k(op) -> bool:
    """Whether a synchronisation model's operation (asmgen/sm90a/protocol.py) waits for a K load."""
    return op is not None and op[0] == "wait" and op[1].startswith("k_full")


def _counts(variant: Path, shipped: dict, pattern: str) -> tuple[int, int]:
    """Instructions that `pattern` matches in a variant's cubin and in its shipped kernel's."""
    return tuple(_count(sass.instructions(path), pattern) for path in (variant, sass.OBJECTS / shipped["file"]))


@pytest.fixture(scope="module")
def pv_smem_variants(tmp_path_factory):
    """The pv_smem.patch variants of both element types, built once for the tests of each."""
    folder = tmp_path_factory.mktemp("pv_smem")
    return folder, experiments.build_patched(folder, "pv_smem.patch", ["pv_smem"])


def test_the_pv_smem_patch_builds_bf16_d128_variants_whose_p_v_reads_p_from_shared_memory(pv_smem_variants):
    folder, built = pv_smem_variants
    entries = [e for e in built if e["dtype"] == "bf16"]
    shipped = {k["name"]: k for k in sm90a.BF16_KERNELS}
    # d = 128 only: the d_qk = 192 kernels have no room for the 32 KiB P tile
    assert {e["name"].removesuffix("_pv_smem") for e in entries} == {n for n, k in shipped.items() if k["d_qk"] == 128}
    for entry in entries:
        assert entry["same_results_as_shipped"] and entry["resources"]["local_bytes"] == 0
        base = shipped[entry["name"].removesuffix("_pv_smem")]
        assert entry["shared_bytes"] == base["shared_bytes"] + 128 * 128 * 2  # a 128-row P tile of 128 BF16 keys
        code = sass.instructions(folder / entry["file"])
        gemms = [c for c in code if "HGMMA" in c]
        assert gemms and not any(re.search(r"HGMMA\S* R\d+, R\d+, gdesc", c) for c in gemms)  # no register A
        # one stmatrix per 16-key step where P is written: the first key tile and every step form (code test: three
        # steady and two diagonal forms; plain ping-pong: one of each), beside the epilogue's own
        forms = 1 + (5 if entry["code_test"] else 2)
        stsm = r"\bSTSM\b"
        assert _count(code, stsm) - _count(sass.instructions(sass.OBJECTS / base["file"]), stsm) == 8 * forms


def test_the_reprobe_patch_tests_the_pending_loads_again_in_every_step_form(tmp_path):
    entries = experiments.build_patched(tmp_path, "reprobe.patch", ["reprobe"], ["bf16"])
    shipped = {k["name"]: k for k in sm90a.BF16_KERNELS}
    assert {e["name"].removesuffix("_reprobe") for e in entries} == set(shipped)
    test_wait = r"SYNCS\.PHASECHK\.TRANS64 "  # mbarrier.test_wait (a try-wait is TRANS64.TRYWAIT)
    for entry in entries:
        assert entry["same_results_as_shipped"] and entry["resources"]["local_bytes"] == 0
        base = shipped[entry["name"].removesuffix("_reprobe")]
        ours, theirs = _counts(tmp_path / entry["file"], base, test_wait)
        added = ours - theirs
        forms = 5 if entry["code_test"] else 2
        # two test-waits per step form more; a kernel shipped without the probe gains the probe's too (two in
        # each step form and two after the first key tile)
        assert added == 2 * forms + (0 if sm90a.probes_ring(base) else 2 * forms + 2)


def test_the_pv_smem_patch_builds_fp8_variants_whose_p_v_reads_p_from_shared_memory(pv_smem_variants):
    folder, built = pv_smem_variants
    entries = [e for e in built if e["dtype"] == "fp8e4m3"]
    assert {(e["p_mode"], e["d_qk"]) for e in entries} == {(p, d) for p in ("exact", "lean") for d in (128, 192)}
    shipped = {k["name"]: k for k in sm90a.FP8_KERNELS}
    for entry in entries:
        assert entry["same_results_as_shipped"] and entry["resources"]["local_bytes"] == 0
        base = shipped[entry["name"].removesuffix("_pv_smem")]
        assert entry["shared_bytes"] == base["shared_bytes"] + 2 * 64 * 128  # each consumer's P, 64 rows of 128 keys
        code = sass.instructions(folder / entry["file"])
        gemms = [c for c in code if "QGMMA" in c]
        # every wgmma reads both operands from shared memory (no register A), and each of the three step forms
        # (first key tile, steady, diagonal) stores its 16 fragment registers
        assert gemms and not any(re.search(r"QGMMA\S* R\d+, R\d+, gdesc", c) for c in gemms)
        assert _count(code, r"\bSTS\b") == 3 * 16


def test_the_fixed_slots_patch_keeps_the_code_test_kernels_descriptors_in_uniform_registers(tmp_path):
    entries = experiments.build_patched(tmp_path, "fixed_slots.patch", ["fixed_slots"], ["bf16"])
    shipped = {k["name"]: k for k in sm90a.BF16_KERNELS}
    # the d_qk = 192 code-test kernel spills with it and is not built (the build refuses spills)
    assert {e["name"].removesuffix("_fixed_slots") for e in entries} == \
        {n for n, k in shipped.items() if not (k["code_test"] and k["d_qk"] == 192)}
    moves = r"\bR2UR\b"  # a register moved into a uniform register, ahead of a wgmma that reads it
    for entry in entries:
        assert entry["same_results_as_shipped"] and entry["resources"]["local_bytes"] == 0
        base = shipped[entry["name"].removesuffix("_fixed_slots")]
        ours, theirs = _counts(tmp_path / entry["file"], base, moves)
        if base["code_test"]:  # two steps per loop trip: the slots are known at compile time
            assert ours < theirs / 5
        else:  # one step per trip: the slot stays a register
            assert ours > theirs / 2


def test_the_prefetch_q_patch_pulls_the_next_jobs_query_tiles_into_l2(tmp_path):
    entries = experiments.build_patched(tmp_path, "prefetch_q.patch", ["prefetch_q"], ["bf16"])
    shipped = {k["name"]: k for k in sm90a.BF16_KERNELS}
    assert {e["name"].removesuffix("_prefetch_q") for e in entries} == set(shipped)
    prefetch = r"\bUTMAPF\b"  # cp.async.bulk.prefetch.tensor
    for entry in entries:
        assert entry["same_results_as_shipped"] and entry["resources"]["local_bytes"] == 0
        base = shipped[entry["name"].removesuffix("_prefetch_q")]
        ours, theirs = _counts(tmp_path / entry["file"], base, prefetch)
        assert theirs == 0 and ours > 0


def test_every_job_order_covers_each_query_tile_once():
    from asmgen.sm90a.experiments import job_orders
    from zyfa import jobs

    for heads, num_tiles in ((128, 16), (32, 64), (7, 9)):
        expected = sorted((0, h, t) for h in range(heads) for t in range(num_tiles))
        for name, build in job_orders.ORDERS.items():
            table = build(1, heads, num_tiles, 132, True)
            walked = sorted(tile for cta in range(table.shape[1]) for tile in jobs.cta_tiles(table, cta))
            assert walked == expected, name
    assert jobs.TAIL_ROUNDS == 2  # the orders leave the shipped table as it was


def test_the_v_stages_patch_deepens_one_ring_of_the_bf16_d128_kernels(tmp_path):
    entries = experiments.build_patched(tmp_path, "v_stages.patch", ["v_stages3", "k_stages3"], ["bf16"])
    shipped = {k["name"]: k for k in sm90a.BF16_KERNELS}
    # a third 32 KiB slot fits beside the d = 128 kernels' shared memory only
    d128 = {n for n, k in shipped.items() if k["d_qk"] == 128}
    assert {e["name"] for e in entries} == {f"{n}_{v}" for n in d128 for v in ("v_stages3", "k_stages3")}
    for entry in entries:
        base = shipped[entry["name"].rsplit("_", 2)[0]]
        assert entry["same_results_as_shipped"] and entry["resources"]["local_bytes"] == 0
        assert (entry["stages"], entry["v_stages"]) == ((2, 3) if entry["name"].endswith("v_stages3") else (3, 2))
        # one more K or V tile; the barriers of the deeper ring's third slot take the place of a third pair
        assert entry["shared_bytes"] == base["shared_bytes"] + 128 * 128 * 2 + 4 * 8


def test_the_split_qk_patch_writes_the_first_halfs_p_between_the_waits_for_the_two_halves(tmp_path):
    entries = experiments.build_patched(tmp_path, "split_qk.patch", ["split_qk"], ["bf16"])
    shipped = {k["name"]: k for k in sm90a.BF16_KERNELS}
    assert {e["name"].removesuffix("_split_qk") for e in entries} == {n for n, k in shipped.items() if k["code_test"]}
    for entry in entries:
        assert entry["same_results_as_shipped"] and entry["resources"]["local_bytes"] == 0
        _, code, base = _codes(tmp_path, entry, "split_qk")
        # every QK^T (A from shared memory) in two N = 64 halves, and no wgmma serialised (a wait after each)
        assert _count(code, r"HGMMA\.64x128x16\S* R\d+, gdesc") == 0 < _count(code, r"HGMMA\.64x64x16")
        assert _count(base, r"HGMMA\.64x128x16\S* R\d+, gdesc") > 0
        assert _count(code, r"WARPGROUP\.DEPBAR") < _count(code, r"HGMMA") / 4
        # in each steady step the first half's 32 exponentials lie between the waits for the two halves
        firsts = [i for i, c in enumerate(code) if "DEPBAR.LE gsb0, 0x2" in c]
        assert len(firsts) >= 2
        for i in firsts:
            j = next(k for k in range(i + 1, len(code)) if "WARPGROUP.DEPBAR" in code[k])
            assert "DEPBAR.LE gsb0, 0x1" in code[j] and _count(code[i:j], r"MUFU\.EX2") == 32


def test_the_release_after_issue_patch_builds_every_bf16_kernel_without_serialised_wgmmas(tmp_path):
    entries = experiments.build_patched(tmp_path, "release_after_issue.patch", ["release_after_issue"], ["bf16"])
    shipped = {k["name"]: k for k in sm90a.BF16_KERNELS}
    assert {e["name"].removesuffix("_release_after_issue") for e in entries} == set(shipped)
    for entry in entries:
        assert entry["same_results_as_shipped"] and entry["resources"]["local_bytes"] == 0
        _, code, base = _codes(tmp_path, entry, "release_after_issue")
        assert _count(code, r"WARPGROUP\.DEPBAR") <= _count(base, r"WARPGROUP\.DEPBAR")  # no wait after each wgmma
        assert _count(code, r"\bHGMMA\b") == _count(base, r"\bHGMMA\b")


def test_the_compact_tail_patch_masks_the_diagonal_step_inside_the_code_test_loop(tmp_path):
    entries = experiments.build_patched(tmp_path, "compact_tail.patch", ["compact_tail"], ["bf16"])
    shipped = {k["name"]: k for k in sm90a.BF16_KERNELS}
    code_test = {n for n, k in shipped.items() if k["code_test"]}
    assert {e["name"].removesuffix("_compact_tail") for e in entries} == code_test
    for entry in entries:
        assert entry["same_results_as_shipped"] and entry["resources"]["local_bytes"] == 0
        _, code, base = _codes(tmp_path, entry, "compact_tail")
        assert _count(code, r"WARPGROUP\.DEPBAR") < _count(code, r"HGMMA") / 4  # no wgmma serialised
        # two step forms (an S wait each) where the shipped kernel has five, in under two thirds of its code
        assert _count(code, r"DEPBAR\.LE gsb0, 0x1") == 2 < _count(base, r"DEPBAR\.LE gsb0, 0x1")
        assert len(code) < 2 / 3 * len(base)


def test_the_late_turn_patch_passes_the_turn_after_the_chosen_exponentials_in_every_step(tmp_path):
    names = ["late_turn1", "late_turn8", "late_turn16"]
    entries = experiments.build_patched(tmp_path, "late_turn.patch", names, ["bf16"])
    shipped = {k["name"]: k for k in sm90a.BF16_KERNELS if k["code_test"]}
    assert {e["name"].rsplit("_late_turn", 1)[0] for e in entries} == set(shipped) and len(entries) == 3 * len(shipped)
    for entry in entries:
        pairs = int(entry["name"].rsplit("_late_turn", 1)[1])
        base, code, shipped_code = _codes(tmp_path, entry, f"late_turn{pairs}")
        assert entry["same_results_as_shipped"] and entry["resources"]["local_bytes"] == 0
        assert entry["shared_bytes"] == base["shared_bytes"] + 16  # the two turn mbarriers
        assert _count(code, r"WARPGROUP\.DEPBAR") == _count(shipped_code, r"WARPGROUP\.DEPBAR")
        assert _count(code, r"BAR\.(SYNC|ARV) R") == 0  # no named-barrier turns left
        # in each step form (an S wait each) the turn's arrival (the one that keeps its state) follows exactly the
        # first `pairs` pairs' exponentials
        waits = [i for i, c in enumerate(code) if "DEPBAR.LE gsb0, 0x1" in c]
        assert len(waits) == 5
        for i in waits:
            j = next(k for k in range(i, len(code)) if re.search(r"SYNCS\.ARRIVE\.TRANS64\.A1T0 R\d", code[k]))
            assert _count(code[i:j], r"MUFU\.EX2") == 2 * pairs


def test_the_first_pair_patch_runs_tile_0s_softmax_under_tile_1s_qk(tmp_path):
    entries = experiments.build_patched(tmp_path, "first_pair.patch", ["first_pair"], ["bf16"])
    # d_qk = 192 spills with it and is not built
    assert [e["name"] for e in entries] == ["sm90a_fwd_bf16_d128_code_test_pingpong_first_pair"]
    entry = entries[0]
    _, code, shipped_code = _codes(tmp_path, entry, "first_pair")
    assert entry["same_results_as_shipped"] and entry["resources"]["local_bytes"] == 0
    assert _count(code, r"\bHGMMA\b") == _count(shipped_code, r"\bHGMMA\b") + 24  # the pair
    assert _count(code, r"WARPGROUP\.DEPBAR") < _count(code, r"HGMMA") / 4  # no wgmma serialised
    # the pair's turn: 16 QK^T wgmmas, then tile 0's 64 exponentials between the waits for its S and tile 1's
    first = next(i for i, c in enumerate(code) if "DEPBAR.LE gsb0, 0x1" in c)
    second = next(i for i in range(first + 1, len(code)) if "WARPGROUP.DEPBAR" in code[i])
    assert "gsb0, 0x0" in code[second] and _count(code[first:second], r"MUFU\.EX2") == 64
    issue = [i for i in range(first) if re.search(r"\bHGMMA\b", code[i])][-16:]
    assert all("gdesc" in code[i] and "tnspB" not in code[i] for i in issue)  # both QK^T: A and B from shared memory


def test_the_k_first_patch_gives_the_producer_a_first_k_load_ahead_of_q(tmp_path):
    entries = experiments.build_patched(tmp_path, "k_first.patch", ["k_first"], ["bf16"])
    shipped = {k["name"]: k for k in sm90a.BF16_KERNELS}
    assert {e["name"].removesuffix("_k_first") for e in entries} == set(shipped)
    for entry in entries:
        base, code, shipped_code = _codes(tmp_path, entry, "k_first")
        assert entry["same_results_as_shipped"] and entry["resources"]["local_bytes"] == 0
        boxes = -(-base["d_qk"] // 64)  # a K tile's TMA boxes of 64 columns
        assert _count(code, r"\bUTMALDG\b") == _count(shipped_code, r"\bUTMALDG\b") + boxes
        assert _count(code, r"\bHGMMA\b") == _count(shipped_code, r"\bHGMMA\b")  # the consumers as shipped


def test_the_lean_epilogue_patch_finishes_the_rows_under_the_last_pv_and_stores_o_from_one_base(tmp_path):
    entries = experiments.build_patched(tmp_path, "lean_epilogue.patch", ["lean_epilogue"])
    shipped = {k["name"]: k for k in sm90a.KERNELS}
    assert {e["name"].removesuffix("_lean_epilogue") for e in entries} == set(shipped)
    for entry in entries:
        base, code, shipped_code = _codes(tmp_path, entry, "lean_epilogue")
        assert not entry.get("same_results_as_shipped") and entry["resources"]["local_bytes"] == 0  # the lse's bits
        assert entry["shared_bytes"] == base["shared_bytes"]
        assert _count(code, GEMM) == _count(shipped_code, GEMM)  # the key loop as shipped
        # the rows' lse by MUFU.LG2, most between the issue of the tile's last P V and the wait for it (ptxas leaves
        # one of the FP8 kernels' two after the wait)
        lg2 = [i for i, c in enumerate(code) if "MUFU.LG2" in c]
        assert lg2 and _count(shipped_code, r"MUFU\.LG2") == 0
        under = [i for i in lg2 if REGISTER_A.search(code[max(j for j in range(i) if re.search(GEMM, code[j]))])
                 and "gsb0, 0x0" in next((c for c in code[i:] if "WARPGROUP.DEPBAR" in c), "")]
        assert len(under) >= (len(lg2) if entry["dtype"] == "bf16" else len(lg2) / 2), entry["name"]
        # after that wait: O's stores as shipped, no division and no software log2, at least 100 instructions fewer
        epilogue, shipped_epilogue = sass.epilogue(code), sass.epilogue(shipped_code)
        assert _count(epilogue, O_STORES) == _count(shipped_epilogue, O_STORES), entry["name"]
        assert _count(epilogue, r"MUFU\.RCP|\bCALL\b|\bFFMA\b") == 0 < _count(shipped_epilogue, r"\bCALL\b")
        assert len(epilogue) <= len(shipped_epilogue) - 100, entry["name"]


def test_the_tile_edges_patch_combines_the_per_tile_patches_in_every_kernel(tmp_path):
    entries = experiments.build_patched(tmp_path, "tile_edges.patch")
    staged = {k["name"] for k in sm90a.KERNELS if sm90a.epilogue_store(k["dtype"], k["p_mode"]) == "staged"}
    assert sorted(e["name"] for e in entries) == sorted(
        [f"{k['name']}_tile_edges" for k in sm90a.KERNELS] + [f"{name}_tile_edges_qk" for name in staged]
        + [f"{k['name']}_tile_edges_qk_direct" for k in sm90a.BF16_KERNELS])
    for entry in entries:
        variant = next(v for v in ("tile_edges_qk_direct", "tile_edges_qk", "tile_edges") if entry["name"].endswith(v))
        under_qk, direct = variant != "tile_edges", variant.endswith("direct")
        base, code, shipped_code = _codes(tmp_path, entry, variant)
        bf16 = base["dtype"] == "bf16"
        assert not entry.get("same_results_as_shipped") and entry["resources"]["local_bytes"] == 0  # the lse's bits
        # first_pair spills at d_qk = 192 (tile_edges_qk): a few loop invariants, none in the key loop
        spills = under_qk and bf16 and base["code_test"] and base["d_qk"] == 192
        assert (entry["resources"]["stack_bytes"] > 0) == spills, entry["name"]
        if bf16:
            assert _count(_key_loop(code), sass.LOCAL_MEMORY.pattern) == 0
        assert _count(code, r"WARPGROUP\.DEPBAR") < _count(code, GEMM) / 4  # no wgmma serialised
        # k_first: the producer's extra K load site (TMA boxes of 64 BF16 or 128 FP8 columns)
        boxes = -(-base["d_qk"] // (64 if bf16 else 128))
        assert _count(code, r"\bUTMALDG\b") == _count(shipped_code, r"\bUTMALDG\b") + boxes
        # lean_epilogue: the lse by MUFU.LG2, the epilogue at least 100 instructions shorter with the same stores
        epilogue, shipped_epilogue = sass.epilogue(code), sass.epilogue(shipped_code)
        assert _count(code, r"MUFU\.LG2") > 0 == _count(epilogue, r"MUFU\.RCP|\bCALL\b|\bFFMA\b")
        if under_qk:  # all of O's stores between the issue of a tile's first QK^T and the wait for it
            assert epilogue == []
            issues = [j for j, c in enumerate(code) if re.search(GEMM + ".*gsb0", c) and not REGISTER_A.search(c)
                      and _waits_next(code, j)]
            assert len(issues) == 1 + (bf16 and base["code_test"] and (base["d_qk"] == 128 or spills))  # the pair's
            for j in issues:  # staged as shipped, or direct: 4-byte stores of the thread's two rows, no shared memory
                wait = next(k for k in range(j, len(code)) if "WARPGROUP.DEPBAR" in code[k])
                if direct:
                    assert _count(code[j:wait], r"STG\.E desc") == 2 * base["d_v"] // 8 and "STSM" not in str(code)
                else:
                    assert _count(code[j:wait], O_STORES) == _count(shipped_epilogue, O_STORES), entry["name"]
        else:
            assert _count(epilogue, O_STORES) == _count(shipped_epilogue, O_STORES)
            assert len(epilogue) <= len(shipped_epilogue) - 100
        s_waits = _count(code, r"DEPBAR\.LE gsb0, 0x1")
        if not (bf16 and base["code_test"]):  # the key loop as shipped
            assert s_waits == _count(shipped_code, r"DEPBAR\.LE gsb0, 0x1")
            assert _count(code, GEMM) == _count(shipped_code, GEMM)
            continue
        # compact_tail: the loop's two step forms (and first_pair's S wait) in less code than the shipped kernel's
        # five, first_pair's turn and a second site of the store under a QK^T included
        first_pair = base["d_qk"] == 128 or spills
        assert s_waits == 2 + first_pair < _count(shipped_code, r"DEPBAR\.LE gsb0, 0x1")
        assert len(code) < (0.9 if under_qk else 0.85) * len(shipped_code)
        if first_pair:  # tile 0's 64 exponentials between the waits for its S and tile 1's
            first = next(i for i, c in enumerate(code) if "DEPBAR.LE gsb0, 0x1" in c)
            second = next(i for i in range(first + 1, len(code)) if "WARPGROUP.DEPBAR" in code[i])
            assert "gsb0, 0x0" in code[second] and _count(code[first:second], r"MUFU\.EX2") >= 64


def test_the_tile_edges_patch_keeps_the_protocol_with_k_first_and_the_first_pair():
    # the patched synchronisation model (its producer's K-first order, the first pair's turns; the FP8 main loop with
    # K first) under random interleavings of the protocol test's job tables, and the model catches a first pair that
    # skips K1's wait
    with experiments.patched_tree("tile_edges.patch") as tree:
        spec = importlib.util.spec_from_file_location("tile_edges_protocol", tree / "asmgen/sm90a/protocol.py")
        model = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = model  # dataclasses look their module up by name
        try:
            spec.loader.exec_module(model)
            # (batch, heads, heads_k, tiles, grid): test_sm90a_protocol.py's tables
            tables = [(1, 4, 2, 6, 3), (2, 3, 3, 5, 4), (1, 8, 2, 4, 5)]
            configs = [model.Config(stages, pingpong=True, k_first=True, first_pair=True) for stages in (2, 3)]
            configs += [model.Config(stages, pingpong, both_gemms=True, k_first=True)  # the FP8 kernels'
                        for stages, pingpong in itertools.product((2, 3), (True, False))]
            for cfg, (batch, heads, heads_k, num_tiles, grid) in itertools.product(configs, tables):
                table = balanced_jobs(batch, heads, num_tiles, grid)
                for cta in range(table.shape[1]):
                    for seed in range(4):
                        assert model.run(cta_tiles(table, cta), heads // heads_k, cfg, seed) > 0
            consume = model.consume

            def without_k1_wait(*args):  # the first pair's wait for key tile 1's K: the one right after key tile 0's
                before = None
                for op in consume(*args):
                    if not (_waits_for_k(op) and _waits_for_k(before)):
                        yield op
                    before = op

            model.consume = without_k1_wait
            tiles = cta_tiles(balanced_jobs(1, 4, 6, 3), 0)
            with pytest.raises(model.ProtocolError, match="holds"):
                for seed in range(200):
                    model.run(tiles, 2, model.Config(k_first=True, first_pair=True), seed)
        finally:
            del sys.modules[spec.name]


def test_a_patch_names_the_variants_it_adds():
    assert experiments.patch_variants("late_turn.patch") == ["late_turn1", "late_turn16", "late_turn8"]
    assert experiments.patch_variants("lean_epilogue.patch") == ["lean_epilogue"]
    assert experiments.patch_variants("exp2_poly.patch") == []  # built by comprehension: named with --only
    for patch in experiments.PATCHES:  # what a patch adds is no variant of the unpatched sources
        assert not set(experiments.patch_variants(patch)) & set(experiments.NAMES), patch


def test_the_command_line_builds_several_patches_variants_and_refuses_an_unnamed_one(tmp_path):
    command = [sys.executable, "-m", "asmgen.sm90a.experiments", str(tmp_path)]
    result = subprocess.run([*command, "--patch", "exp2_poly.patch"], capture_output=True, text=True)
    assert result.returncode == 2 and "name its variants with --only" in result.stderr
    result = subprocess.run([*command, "--patch", "k_first.patch", "late_turn.patch", "--only", "k_first"],
                            capture_output=True, text=True)
    assert result.returncode == 2 and "--only goes with one --patch" in result.stderr
    subprocess.run([*command, "--patch", "k_first.patch", "compact_tail.patch", "--dtype", "bf16"], check=True,
                   capture_output=True)
    names = {e["name"] for e in json.loads((tmp_path / "manifest.json").read_text())["kernels"]}
    code_test = {k["name"] for k in sm90a.BF16_KERNELS if k["code_test"]}
    assert names == {f"{k['name']}_k_first" for k in sm90a.BF16_KERNELS} | {f"{n}_compact_tail" for n in code_test}
