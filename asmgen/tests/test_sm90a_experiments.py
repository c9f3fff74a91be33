"""The measurement variants of asmgen/sm90a/experiments build from the shipped kernels' configurations with one
choice changed, and none equal to its shipped kernel is built. Needs nvcc and cuobjdump, like
`python -m asmgen.build --check`."""

from __future__ import annotations

import itertools
import json
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from asmgen import sm90a
from asmgen.sm90a import experiments, sass


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
        # from one step's S wait to the next, one clock read per lap: no lap's time read again later (past the
        # first pair's S wait, with its ten laps over two turns)
        pair = entry["code_test"] and sm90a.CODE_TEST_EDGE[entry["d_qk"]] == "first_pair"
        assert sum("SR_CLOCKLO" in c for c in code[waits[pair]:waits[pair + 1]]) == (6 if ahead else 5)
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


def test_the_timing_patch_builds_timed_regions_variants_whose_region_sums_the_reader_splits(tmp_path):
    from asmgen.sm90a.experiments import timing

    entries = experiments.build_patched(tmp_path, "timing.patch", ["timed_regions"], ["bf16"])
    # every BF16 kernel but the d_qk = 192 code-test one, which spills 8 bytes around its tile loop with it
    assert {e["name"] for e in entries} == {f"{k['name']}_timed_regions" for k in sm90a.BF16_KERNELS
                                            if not (k["code_test"] and k["d_qk"] == 192)}
    for entry in entries:
        assert entry["timed_regions"] and entry["resources"]["local_bytes"] == 0
        code = sass.instructions(tmp_path / entry["file"])
        # the flushes, lane 0's adds of a group's slots: after the Q wait and at the end as without regions, after
        # the first steps, and before and after each form of the diagonal step
        adds = _count(code, r"\bREDG\.E\.ADD")
        assert adds % len(timing.SLOTS["bf16"]) == 0 and adds >= 5 * len(timing.SLOTS["bf16"])
    # two CTAs, consumer warp 0 of each warpgroup: 4 query tiles of 5 key tiles on average (16 after the first ones),
    # 10 steady steps of 1000 cycles, the diagonal steps and the first steps 2000 a tile each, the last P V and the
    # epilogue 1000 a tile; the clock's total 8000 a tile (500 of it between the laps), 3000 beyond five steady steps
    slots, groups = timing.SLOTS["bf16"], len(timing.REGIONS)
    sums = [0] * (2 * timing.CONSUMER_WARPS * groups * len(slots))
    for cta in (0, 1):
        for consumer in (0, 1):
            base = (cta * timing.CONSUMER_WARPS + 4 * consumer) * groups * len(slots)
            for region, steps, phase, cycles in (("last", 16, "epilogue", 4000), ("first", 4, "gemm_wait", 8000),
                                                 ("steady", 10, "softmax", 10000), ("diagonal", 4, "softmax", 8000)):
                group = base + timing.REGIONS.index(region) * len(slots)
                sums[group + slots.index("steps")] = steps
                sums[group + slots.index(phase)] = cycles
            sums[base + slots.index("total")] = 32000
    rows = timing.per_region(sums, grid=2)
    steady = next(r for r in rows if r["consumer"] == 1 and r["region"] == "steady")
    assert steady["softmax"] == 2500 and steady["count"] == 10 and steady["tiles"] == 4
    assert steady["per_step"] == 1000 and steady["total"] == 8000 and steady["per_tile_work"] == 3000
    assert next(r for r in rows if r["region"] == "last")["epilogue"] == 1000
    # the longest walk: CTA 1's first consumer, whose total is spread over two groups
    sums[(1 * timing.CONSUMER_WARPS) * groups * len(slots) + slots.index("total")] = 30000
    sums[(1 * timing.CONSUMER_WARPS) * groups * len(slots) + len(slots) + slots.index("total")] = 6000
    assert timing.walk_cycles(sums, grid=2, dtype="bf16", groups=groups) == 36000
    # CTA 0's walk of 32000 cycles waits 4000 for CTA 1's: the SMs idle 1 - 34000 / 36000 of the time
    assert timing.walks(sums, grid=2, dtype="bf16", groups=groups).tolist() == [32000, 36000]
    assert timing.idle_share(sums, grid=2, dtype="bf16", groups=groups) == pytest.approx(1 - 34000 / 36000)


def test_the_timing_patch_times_the_regions_with_each_epilogue_store(tmp_path):
    entries = experiments.build_patched(tmp_path, "timing.patch", ["timed_regions_bulk", "timed_regions_direct"],
                                        ["bf16"])
    # bulk staging fits beside d = 128 only; the d_qk = 192 code-test kernel spills with the regions (as shipped)
    spills = {k["name"] for k in sm90a.BF16_KERNELS if k["code_test"] and k["d_qk"] == 192}
    assert {e["name"] for e in entries} == (
        {f"{k['name']}_timed_regions_bulk" for k in sm90a.BF16_KERNELS if k["d_qk"] == 128}
        | {f"{k['name']}_timed_regions_direct" for k in sm90a.BF16_KERNELS if k["name"] not in spills})
    for entry in entries:
        assert entry["timed_regions"] and entry["resources"]["local_bytes"] == 0
        code = sass.instructions(tmp_path / entry["file"])
        assert _count(code, r"STG\.E\.128") == 0  # no staged read-back stores
        if entry["name"].endswith("_bulk"):
            assert _count(code, r"UBLKCP\.G\.S") > 0 and _count(code, r"STSM") > 0
        else:
            assert _count(code, r"UBLKCP") == 0 and _count(code, r"STSM") == 0


def test_the_prefetch_patch_pulls_job_rows_into_l1_and_q_k_v_into_l2_before_the_producer_waits(tmp_path):
    entries = experiments.build_patched(tmp_path, "prefetch.patch", dtypes=["bf16"])
    assert {e["name"] for e in entries} == {f"{k['name']}_{v}" for k in sm90a.BF16_KERNELS
                                            for v in ("prefetch_job", "prefetch_q", "prefetch_qkv")}
    prefetched = {}
    for entry in entries:
        assert entry["same_results_as_shipped"] and entry["resources"]["local_bytes"] == 0
        code = sass.instructions(tmp_path / entry["file"])
        row_prefetches = [i for i, c in enumerate(code) if "CCTL.E.PF1" in c]
        tile_prefetches = [i for i, c in enumerate(code) if "UTMAPF.L2" in c]
        # the job rows' loads: the consumers', the producer's, and with the tiles' prefetch the producer's of the
        # next row; each job's own with the next row's prefetch just ahead of it
        loads = [i for i, c in enumerate(code) if re.search(r"\bLDG\.E\.128\b", c)]
        assert len(row_prefetches) == 2 and all(load - p < 4 for p, load in zip(row_prefetches, loads, strict=False))
        if entry["name"].endswith("prefetch_job"):
            assert len(loads) == 2 and not tile_prefetches
            continue
        # the tiles' prefetches after the producer's row load, ahead of its first wait of the tile
        assert len(loads) == 3
        first_wait = next(i for i in range(loads[1], len(code)) if "SYNCS.PHASECHK.TRANS64.TRYWAIT" in code[i])
        assert tile_prefetches and all(loads[1] < p < first_wait for p in tile_prefetches)
        prefetched[entry["name"]] = len(tile_prefetches)
    for kernel in sm90a.BF16_KERNELS:  # K and V besides Q
        assert prefetched[f"{kernel['name']}_prefetch_qkv"] > prefetched[f"{kernel['name']}_prefetch_q"]


def _built(tmp_path, patch: str, variant: str) -> dict[str, tuple[list[str], list[str]]]:
    """`patch`'s variant `variant` of each BF16 kernel it builds for, checked to give the shipped results without
    local memory: the shipped kernel's name -> the variant's code and the shipped kernel's."""
    built = {}
    for entry in experiments.build_patched(tmp_path, patch, [variant], dtypes=["bf16"]):
        assert entry["same_results_as_shipped"] and entry["resources"]["local_bytes"] == 0
        name = entry["name"].removesuffix(f"_{variant}")
        built[name] = (sass.instructions(tmp_path / entry["file"]), sass.instructions(sass.OBJECTS / f"{name}.cubin"))
    return built


def _first_pair_kernel() -> str:
    (kernel,) = [k for k in sm90a.BF16_KERNELS if k["code_test"] and sm90a.CODE_TEST_EDGE[k["d_qk"]] == "first_pair"]
    return kernel["name"]


def test_the_one_tail_patch_runs_every_steady_step_in_the_loop(tmp_path):
    built = _built(tmp_path, "one_tail.patch", "one_tail")
    assert list(built) == [_first_pair_kernel()]  # no other kernel has the first pair's loop
    code, shipped = built[_first_pair_kernel()]
    # one steady step's wgmmas fewer (QK^T and P V, 16 at d = 128): the tail's copy of the loop's first form
    assert _count(shipped, GEMM) - _count(code, GEMM) == 16


def test_the_double_q_patch_gives_the_d128_kernels_a_second_q_buffer_loaded_first(tmp_path):
    entries = experiments.build_patched(tmp_path, "stores_under_qk.patch", ["double_q"], dtypes=["bf16"])
    shipped = {f"{k['name']}_double_q": k for k in sm90a.BF16_KERNELS}
    # d_qk = 192 has no room for a second Q tile
    assert sorted(e["name"] for e in entries) == sorted(n for n, k in shipped.items() if k["d_qk"] == 128)
    for entry in entries:
        kernel = shipped[entry["name"]]
        assert entry["same_results_as_shipped"] and entry["resources"]["local_bytes"] == 0
        assert entry["shared_bytes"] - kernel["shared_bytes"] == 128 * 128 * 2 + 2 * 8  # a Q tile, its two barriers
        code = sass.instructions(tmp_path / entry["file"])
        before = sass.instructions(sass.OBJECTS / Path(kernel["file"]).name)
        assert _count(code, GEMM) == _count(before, GEMM)
        assert _count(code, r"SYNCS\.EXCH\.64") - _count(before, r"SYNCS\.EXCH\.64") == 2  # barrier inits
        # Q goes first at every query tile: the code-test kernel's copy of the first K's loads (kKFirst) is gone
        k_boxes = 128 // 64
        assert _count(before, "UTMALDG") - _count(code, "UTMALDG") == (k_boxes if kernel["code_test"] else 0)


@pytest.mark.parametrize("variant", ["stores_under_qk", "stores_under_qk_double_q", "tile_start"])
def test_the_stores_under_qk_patch_stores_each_tiles_o_under_the_next_first_qk(tmp_path, variant):
    built = _built(tmp_path, "stores_under_qk.patch", variant)
    code_test = {k["name"]: k for k in sm90a.BF16_KERNELS if k["code_test"]}
    # the code-test kernels, d_qk = 192 only without the second Q buffer it has no room for (any other kernel built
    # has that buffer alone)
    assert {n for n in built if n in code_test} == {n for n, k in code_test.items()
                                                    if variant == "stores_under_qk" or k["d_qk"] == 128}
    for name, (code, shipped) in built.items():
        if name not in code_test:
            continue
        assert _count(code, GEMM) == _count(shipped, GEMM)
        # the sites that store a tile's O: after the first step's QK^T (and the first pair's, at d = 128), each with
        # all its stmatrix and 16-byte stores between those QK^T and their wait, and after the walk
        sites = 3 if name == _first_pair_kernel() else 2
        assert _count(code, "STSM") == sites * _count(shipped, "STSM")
        assert not sass.epilogue(code)  # no P V wait ahead of the stores
        stores = [i for i, c in enumerate(code) if c.startswith("STSM") or "STG.E.128" in c]
        assert sum(_in_flight(code, at) for at in stores) == (sites - 1) * len(stores) // sites


def test_the_pair_k_ahead_variant_loads_the_first_pairs_second_k_before_its_first_v(tmp_path):
    built = _built(tmp_path, "stores_under_qk.patch", "pair_k_ahead")
    assert list(built) == [_first_pair_kernel()]
    code, shipped = built[_first_pair_kernel()]
    assert _count(code, GEMM) == _count(shipped, GEMM)
    assert _count(code, "UTMALDG") - _count(shipped, "UTMALDG") == 128 // 64  # K of key tile 1: its two boxes


@pytest.mark.parametrize("variant", ["tma_store", "tma_store_one_box", "tma_store_late"])
def test_the_tma_store_patch_hands_each_warps_o_to_the_tma_engine_in_two_tensor_stores(tmp_path, variant):
    built = _built(tmp_path, "tma_store.patch", variant)
    # both boxes staged at once take 16 KiB more shared memory: d = 128 only
    assert sorted(built) == sorted(k["name"] for k in sm90a.BF16_KERNELS
                                   if variant == "tma_store_one_box" or k["d_qk"] == 128)
    for name, (code, shipped) in built.items():
        assert _count(code, GEMM) == _count(shipped, GEMM)
        assert _count(code, "STSM") == _count(shipped, "STSM")  # the same staging of the accumulator's blocks
        assert not _count(code, r"LDS\.128|STG\.E\.128|UBLKCP")  # no read-back, no 16-byte stores
        if variant != "tma_store_late":
            assert _count(code, "UTMASTG") == 2 and 0 < len(sass.epilogue(code)) < len(sass.epilogue(shipped))
            continue
        # the stores issued at each tile start (the first step, and the first pair in the code-test kernel) with
        # that start's first GEMMs in flight, and after the walk
        starts = 2 if name == _first_pair_kernel() else 1
        stores = [i for i, c in enumerate(code) if "UTMASTG" in c]
        assert len(stores) == 2 * (starts + 1) and sum(_in_flight(code, at) for at in stores) == 2 * starts
    for entry in json.loads((tmp_path / "manifest.json").read_text())["kernels"]:
        assert entry["args"][:-1] == sm90a.ARGS and entry["args"][-1]["name"] == "out_map"  # after the shipped ones
        staging = entry["shared_bytes"] - sm90a.shared_bytes(entry, "direct")
        assert staging == (1 if variant == "tma_store_one_box" else 2) * 128 * 128  # 128 rows of 1 or 2 boxes


def test_the_timing_tma_store_patch_times_the_regions_of_kernels_that_store_o_by_tensor_stores(tmp_path):
    from asmgen.sm90a.experiments import timing

    names = ["timed_regions", "timed_regions_tensor", "timed_regions_tensor_one_box"]
    entries = {e["name"]: e for e in experiments.build_patched(tmp_path, "timing_tma_store.patch", names, ["bf16"])}
    # both boxes staged at once fit beside d = 128 only; the d_qk = 192 code-test kernel spills with the regions
    assert set(entries) == {f"{k['name']}_{v}" for k in sm90a.BF16_KERNELS for v in names
                            if not (k["code_test"] and k["d_qk"] == 192)
                            and (v != "timed_regions_tensor" or k["d_qk"] == 128)}
    for name, entry in entries.items():
        assert entry["timed_regions"] and entry["resources"]["local_bytes"] == 0
        code = sass.instructions(tmp_path / entry["file"])
        assert _count(code, r"\bREDG\.E\.ADD") >= 5 * len(timing.SLOTS["bf16"])  # the regions' flushes
        tensor = not name.endswith("_timed_regions")
        assert _count(code, "UTMASTG") == (2 if tensor else 0) and _count(code, O_STORES) > 0
        assert (entry["args"][-1]["name"] == "out_map") == tensor
        # the same key loop as the control's: as many wgmmas and exponentials
        control = sass.instructions(tmp_path / entries[name.split("_timed_regions")[0] + "_timed_regions"]["file"])
        assert _count(code, GEMM) == _count(control, GEMM)
        assert _count(code, "MUFU.EX2") == _count(control, "MUFU.EX2")


@pytest.mark.parametrize("variant", ["job_slot", "dynamic_jobs"])
def test_the_dynamic_jobs_patch_hands_the_jobs_over_in_shared_memory_and_keeps_the_key_loop(tmp_path, variant):
    built = _built(tmp_path, "dynamic_jobs.patch", variant)
    assert sorted(built) == sorted(k["name"] for k in sm90a.BF16_KERNELS)
    for code, shipped in built.values():
        # dynamic_jobs: the scheduler's takes and its count among the CTAs done, the last CTA's two resets
        counter = variant == "dynamic_jobs"
        assert _count(code, r"ATOMG\.E\.ADD") == 2 * counter and _count(code, r"ATOMG\.E\.EXCH") == 2 * counter
        assert _count(code, r"\bSTS\.128") == 1 and not _count(shipped, r"\bATOMG")  # the job slot
        assert _count(code, GEMM) == _count(shipped, GEMM)
        assert _count(code, "MUFU.EX2") == _count(shipped, "MUFU.EX2")
    for entry in json.loads((tmp_path / "manifest.json").read_text())["kernels"]:
        shipped = next(k for k in sm90a.KERNELS if k["name"] == entry["name"].removesuffix(f"_{variant}"))
        assert entry[variant] and entry["shared_bytes"] == shipped["shared_bytes"] + 32  # 2 barriers, a job


def _dynamic_walk(rows: list, grid: int, counts: list, rng) -> list[list[list]]:
    """A model of dynamic_jobs.patch's walk (tile_scheduler.cuh, schedule_jobs and take_jobs with kDynamicJobs) under a
    random interleaving of every CTA's scheduler and its nine readers (the producer thread and the consumer warps):
    the jobs each reader of each CTA walked. `counts` is the counter row, left as the last CTA leaves it."""
    from asmgen.sm90a.protocol import Barrier

    readers, walked = 9, [[[] for _ in range(9)] for _ in range(grid)]
    full, empty = [Barrier(1) for _ in range(grid)], [Barrier(readers) for _ in range(grid)]
    slot = [None] * grid  # the slot's job

    def take() -> int:
        counts[0] += 1
        return grid + counts[0] - 1

    def scheduler(cta):
        index, parity = cta, 0
        while True:
            job = rows[index] if index < len(rows) else None
            if job is not None and job[2] < 0:  # an empty row
                index = take()
                yield
                continue
            while empty[cta].phases % 2 == parity ^ 1:  # mbar_wait(job_empty, parity ^ 1)
                yield
            slot[cta], parity = job, parity ^ 1
            full[cta].arrive()
            if job is None:
                break
            index = take()
            yield
        counts[1] += 1
        if counts[1] == grid:  # the last CTA done
            counts[0] = counts[1] = 0

    def reader(cta, r):
        for parity in itertools.cycle((0, 1)):
            while full[cta].phases % 2 == parity:  # mbar_wait(job_full, parity)
                yield
            job = slot[cta]
            empty[cta].arrive()
            if job is None:
                return
            walked[cta][r].append(job)
            yield

    actors = [scheduler(c) for c in range(grid)] + [reader(c, r) for c in range(grid) for r in range(readers)]
    for _ in range(200_000):
        if not actors:
            return walked
        actor = rng.choice(actors)
        try:
            next(actor)
        except StopIteration:
            actors.remove(actor)
    raise AssertionError("the walk did not end: a deadlock")


def test_the_dynamic_walk_gives_each_row_to_one_cta_whose_readers_all_walk_it_and_resets_its_counter():
    rng = random.Random(0)
    rows = [[0, h, t, 7 - t] for h in range(5) for t in range(4)] + [[0, 5, t, t] for t in (7, 6, 5, 4, 3, 2, 1, 0)]
    rows[9] = [-1, -1, -1, -1]  # an empty row (a static table's padding) is skipped
    counts = [0, 0]
    for launch in range(20):  # launches in a row: each starts from the counter the last one left
        grid = rng.choice((1, 3, 8, len(rows)))
        walked = _dynamic_walk(rows, grid, counts, rng)
        assert counts == [0, 0], launch
        for cta in walked:
            assert all(walk == cta[0] for walk in cta)  # the producer and every consumer warp walk the same jobs
        taken = sorted(tuple(job) for cta in walked for job in cta[0])
        assert taken == sorted(tuple(row) for row in rows if row[2] >= 0)


def test_the_dynamic_jobs_patch_gives_the_host_a_table_of_every_tile_pairs_first_then_singles_largest_first():
    import ast

    import numpy as np

    from zyfa.backends import sm90a as backend

    with experiments.patched_tree("dynamic_jobs.patch") as tree:
        source = (tree / experiments.HOST_FILES[0]).read_text()
    (function,) = [node for node in ast.parse(source).body
                   if isinstance(node, ast.FunctionDef) and node.name == "dynamic_job_table"]
    namespace = {"np": np, "host_job_table": backend.host_job_table}
    exec(compile(ast.Module([function], type_ignores=[]), "dynamic_job_table", "exec"), namespace)
    for batch, heads, tiles, grid in ((1, 128, 16, 132), (2, 3, 7, 132), (1, 32, 64, 132), (1, 1, 5, 8)):
        (table,) = namespace["dynamic_job_table"](batch, heads, tiles, grid)
        rows, counter = table[:-1], table[-1]
        assert counter.tolist() == [0, 0, 0, 0] and (rows[:, 2] >= 0).all()
        tiles_of = sorted((b, h, t) for b, h, lo, hi in rows.tolist() for t in {lo, hi})
        assert tiles_of == sorted((b, h, t) for b in range(batch) for h in range(heads) for t in range(tiles))
        single = rows[:, 2] == rows[:, 3]
        first_single = int(np.argmax(single)) if single.any() else len(rows)
        assert single[first_single:].all()  # the pairs, then the single tiles
        assert (np.diff(rows[first_single:, 2]) <= 0).all()  # largest first


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


def test_the_diagonal_half_patch_builds_half_diagonal_forms_that_keep_the_wgmma_pipeline(tmp_path):
    entries = {e["name"]: e for e in experiments.build_patched(tmp_path, "diagonal_half.patch", None, ["bf16"])}
    # every BF16 kernel but the d = 128 plain one, which ptxas serialises (the build refuses it)
    assert set(entries) == {f"{k['name']}_{v}" for k in sm90a.BF16_KERNELS for v in ("diagonal_half",
                            "diagonal_half_softmax") if k["code_test"] or k["d_qk"] == 192}
    for name, entry in entries.items():
        assert entry["same_results_as_shipped"] and entry["resources"]["local_bytes"] == 0
        code = sass.instructions(tmp_path / entry["file"])
        assert not sass.serialised(code)
        kernel = next(k for k in sm90a.BF16_KERNELS if name.startswith(k["name"] + "_"))
        compact = kernel["code_test"] and sm90a.CODE_TEST_EDGE[kernel["d_qk"]] == "compact_tail"
        # the half QK^T in each diagonal step form (the plain loop's one, the code-test loop's two tails; none in the
        # compact tail, whose diagonal step is flagged): d_qk / 16 wgmmas each
        forms = 0 if compact else 2 if kernel["code_test"] else 1
        assert sum("HGMMA.64x64x16" in c for c in code) == forms * kernel["d_qk"] // 16, name
        if name.endswith("_softmax") and kernel["code_test"] and not compact:
            # the d = 128 code-test kernel's two half diagonal forms: 64 exponentials of P under P V, not 128
            assert sorted(s.exponentials for s in sass.steps(code))[:2] == [66, 66], name


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
    # the fetch loops: each body straight-line code of its size (16 bytes an instruction) and nothing else
    fetch = microbench.loop_mixes(tmp_path / "code_fetch.cubin")
    for kb in microbench.FETCH_KB:
        mix = fetch[f"fetch_{kb}kb"]
        assert microbench.count(mix, "FFMA") + microbench.count(mix, "IADD3") == kb * 1024 // microbench.SASS_BYTES
        assert sum(mix.values()) - kb * 1024 // microbench.SASS_BYTES <= 4  # the loop's counter, test and branch
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


def _in_flight(code: list[str], at: int) -> bool:
    """Whether a wgmma issued before instruction `at` of `code` is not yet waited for there."""
    def last(pattern: str) -> int:
        return max((i for i in range(at) if re.search(pattern, code[i])), default=-1)

    return last(GEMM) > last("WARPGROUP.DEPBAR")


def _count(code: list[str], pattern: str) -> int:
    """Instructions of `code` (sass.instructions) that `pattern` matches."""
    return sum(re.search(pattern, c) is not None for c in code)


def _codes(folder: Path, entry: dict, variant: str) -> tuple[dict, list[str], list[str]]:
    """The shipped kernel a variant `<kernel>_<variant>` of `folder` was built from (its manifest entry), and the
    variant's and that kernel's instructions."""
    base = next(k for k in sm90a.KERNELS if k["name"] == entry["name"].removesuffix(f"_{variant}"))
    return base, sass.instructions(folder / entry["file"]), sass.instructions(sass.OBJECTS / base["file"])


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


def test_the_no_tile_edges_variants_take_the_per_tile_choices_away(tmp_path):
    # every shipped BF16 kernel (with the per-tile choices, CODE_TEST_EDGE) against itself without them
    entries = experiments.build_variants(tmp_path, ["no_tile_edges"], ["bf16"])
    assert sorted(e["name"] for e in entries) == sorted(f"{k['name']}_no_tile_edges" for k in sm90a.BF16_KERNELS)
    for entry in entries:
        base, plain, edges = _codes(tmp_path, entry, "no_tile_edges")
        edge = sm90a.CODE_TEST_EDGE[base["d_qk"]] if base["code_test"] else None
        assert entry["resources"]["local_bytes"] == 0 and entry["shared_bytes"] == base["shared_bytes"]
        assert _count(plain, r"WARPGROUP\.DEPBAR") < _count(plain, GEMM) / 4  # no wgmma serialised
        # kKFirst (code-test kernels): the producer's extra K load site (TMA boxes of 64 columns)
        boxes = -(-base["d_qk"] // 64) if edge else 0
        assert _count(edges, r"\bUTMALDG\b") == _count(plain, r"\bUTMALDG\b") + boxes
        # kLeanEpilogue: the rows' lse by MUFU.LG2 between the issue of the tile's last P V and the wait for it;
        # after that wait O's stores as without, no division and no software log2, at least 100 instructions fewer
        lg2 = [i for i, c in enumerate(edges) if "MUFU.LG2" in c]
        assert lg2 and _count(plain, r"MUFU\.LG2") == 0
        assert all(REGISTER_A.search(edges[max(j for j in range(i) if re.search(GEMM, edges[j]))])
                   and "gsb0, 0x0" in next(c for c in edges[i:] if "WARPGROUP.DEPBAR" in c) for i in lg2)
        epilogue, plain_epilogue = sass.epilogue(edges), sass.epilogue(plain)
        assert _count(epilogue, O_STORES) == _count(plain_epilogue, O_STORES)
        assert _count(epilogue, r"MUFU\.RCP|\bCALL\b|\bFFMA\b") == 0 < _count(plain_epilogue, r"\bCALL\b")
        assert len(epilogue) <= len(plain_epilogue) - 100, entry["name"]
        # the key loop: an S wait per step form, five in the code-test loop without its edge (two a trip, three
        # tails); kCompactTail two, in under two thirds of the code; kFirstPair one more (the pair's second QK^T),
        # 24 wgmmas more (the pair's turn and its P V); the ping-pong kernels' loop as it was
        s_waits = _count(edges, r"DEPBAR\.LE gsb0, 0x1"), _count(plain, r"DEPBAR\.LE gsb0, 0x1")
        if edge == "compact_tail":
            assert s_waits == (2, 5) and len(edges) < 2 / 3 * len(plain)
        elif edge == "first_pair":
            assert s_waits == (6, 5) and _count(edges, GEMM) == _count(plain, GEMM) + 24
            # the pair's turn: 16 QK^T wgmmas from shared memory, then tile 0's 64 exponentials between the waits
            # for its S and tile 1's
            first = next(i for i, c in enumerate(edges) if "DEPBAR.LE gsb0, 0x1" in c)
            second = next(i for i in range(first + 1, len(edges)) if "WARPGROUP.DEPBAR" in edges[i])
            assert "gsb0, 0x0" in edges[second] and _count(edges[first:second], r"MUFU\.EX2") == 64
            issue = [i for i in range(first) if re.search(r"\bHGMMA\b", edges[i])][-16:]
            assert all("gdesc" in edges[i] and "tnspB" not in edges[i] for i in issue)
        else:
            assert s_waits[0] == s_waits[1] and _count(edges, GEMM) == _count(plain, GEMM)


def test_a_patch_names_the_variants_it_adds():
    assert experiments.patch_variants("timing.patch") == ["timed", "timed_fine", "timed_no_code_test",
                                                          "timed_no_tile_edges", "timed_pingpong", "timed_regions",
                                                          "timed_regions_bulk", "timed_regions_direct"]
    assert experiments.patch_variants("trio.patch") == ["trio"]
    assert experiments.patch_variants("diagonal_half.patch") == ["diagonal_half", "diagonal_half_softmax"]
    assert experiments.patch_variants("prefetch.patch") == ["prefetch_job", "prefetch_q", "prefetch_qkv"]
    assert experiments.patch_variants("one_tail.patch") == ["one_tail"]
    assert experiments.patch_variants("tma_store.patch") == ["tma_store", "tma_store_late", "tma_store_one_box"]
    assert experiments.patch_variants("dynamic_jobs.patch") == ["dynamic_jobs", "job_slot"]
    both = set(experiments.patch_variants("timing.patch") + experiments.patch_variants("tma_store.patch"))
    assert set(experiments.patch_variants("timing_tma_store.patch")) == both | {"timed_regions_tensor",
                                                                                 "timed_regions_tensor_one_box"}
    assert experiments.patch_variants("stores_under_qk.patch") == ["double_q", "pair_k_ahead", "stores_under_qk",
                                                                   "stores_under_qk_double_q", "tile_start"]
    assert experiments.patch_variants("exp2_poly.patch") == []  # built by comprehension: named with --only
    for patch in experiments.PATCHES:  # what a patch adds is no variant of the unpatched sources
        assert not set(experiments.patch_variants(patch)) & set(experiments.NAMES), patch


def test_the_command_line_builds_several_patches_variants_and_refuses_an_unnamed_one(tmp_path):
    command = [sys.executable, "-m", "asmgen.sm90a.experiments", str(tmp_path)]
    result = subprocess.run([*command, "--patch", "exp2_poly.patch"], capture_output=True, text=True)
    assert result.returncode == 2 and "name its variants with --only" in result.stderr
    result = subprocess.run([*command, "--patch", "pv_overlap.patch", "alternate.patch", "--only", "pv_overlap"],
                            capture_output=True, text=True)
    assert result.returncode == 2 and "--only goes with one --patch" in result.stderr
    subprocess.run([*command, "--patch", "pv_overlap.patch", "alternate.patch"], check=True, capture_output=True)
    names = {e["name"] for e in json.loads((tmp_path / "manifest.json").read_text())["kernels"]}
    assert names == {f"{k['name']}_{v}" for k in sm90a.FP8_KERNELS for v in ("pv_overlap", "alternate")}
