"""The gfx950 assembly generator: deterministic, assembles, declares what the manifest says, registers and hazards
consistent, instructions from the agreed set, faults injected where intended."""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path

import numpy as np
import pytest
import torch

from asmgen import build as build_driver
from asmgen import gfx950
from asmgen.gfx950 import hazards, kernel, schedule, toolchain
from asmgen.sim.valu import fma_f32
from zyfa import numerics

NAMES = sorted(gfx950.VARIANTS)
ARCH_VGPRS = 256
LDS_LIMIT = 160 * 1024
# The instruction set the simulator implements (docs/gfx950.md, "instructions used").
ALLOWED = set("""
s_endpgm s_waitcnt s_barrier s_nop s_branch s_cbranch_scc0 s_cbranch_scc1 s_cbranch_vccz s_cbranch_vccnz
s_cbranch_execz s_cbranch_execnz s_setprio s_mov_b32 s_mov_b64 s_movk_i32 s_add_u32 s_addc_u32 s_sub_u32 s_subb_u32
s_add_i32 s_sub_i32 s_mul_i32 s_mul_hi_u32 s_lshl_b32 s_lshl_b64 s_lshr_b32 s_ashr_i32 s_and_b32 s_and_b64 s_or_b32
s_or_b64 s_xor_b32 s_xor_b64 s_andn2_b32 s_andn2_b64 s_cselect_b32 s_cselect_b64 s_min_u32 s_min_i32 s_max_u32
s_max_i32 s_bfe_u32 s_addk_i32 s_mulk_i32 s_load_dword s_load_dwordx2 s_load_dwordx4 s_load_dwordx8
s_and_saveexec_b64 v_mov_b32 v_add_f32 v_sub_f32 v_mul_f32 v_fma_f32 v_fmac_f32 v_max_f32 v_min_f32 v_max3_f32
v_med3_f32 v_exp_f32 v_log_f32 v_rcp_f32 v_floor_f32 v_rndne_f32 v_ldexp_f32 v_cvt_f32_i32 v_cvt_f32_u32
v_cvt_i32_f32 v_cvt_u32_f32 v_cvt_pk_fp8_f32 v_cvt_pk_u8_f32 v_cvt_pk_bf16_f32 v_perm_b32 v_lshlrev_b32 v_lshrrev_b32
v_ashrrev_i32
v_and_b32 v_or_b32 v_xor_b32 v_add_u32 v_sub_u32 v_mul_lo_u32 v_mul_u32_u24 v_mad_u32_u24 v_lshl_add_u32
v_add_lshl_u32 v_lshl_or_b32 v_and_or_b32 v_bfe_u32 v_cndmask_b32 v_readfirstlane_b32 v_readlane_b32
v_permlane32_swap_b32 v_permlane16_swap_b32 v_pk_mul_f32 v_pk_add_f32 v_pk_fma_f32 v_accvgpr_read_b32
v_accvgpr_write_b32 v_mfma_f32_32x32x64_f8f6f4 v_mfma_f32_16x16x128_f8f6f4 v_mfma_scale_f32_32x32x64_f8f6f4
v_mfma_scale_f32_16x16x128_f8f6f4 ds_read_b32 ds_read_b64 ds_read_b128 ds_write_b32 ds_write_b64 ds_write_b128
ds_read_b64_tr_b8 ds_bpermute_b32 buffer_load_dword buffer_load_dwordx2 buffer_load_dwordx4 buffer_store_dword
buffer_store_dwordx2 buffer_store_dwordx4 buffer_store_short global_load_dword global_load_dwordx2
global_load_dwordx4 global_store_dword global_store_dwordx2 global_store_dwordx4 global_store_short
""".split()) | {f"v_cmp_{c}_{t}" for c in ("eq", "ne", "lt", "le", "gt", "ge") for t in ("f32", "u32", "i32")} | {
    f"s_cmp_{c}_{t}" for c in ("eq", "lg", "lt", "le", "gt", "ge") for t in ("u32", "i32")}


@cache
def text(name: str, faults: frozenset[str] = frozenset()) -> str:
    return gfx950.generate(name, faults)


@cache
def code_object(name: str) -> bytes:
    return gfx950.assemble(text(name))


@cache
def disassembly(name: str, tmp: Path) -> list[str]:
    path = tmp / f"{name}.co"
    path.write_bytes(code_object(name))
    out = subprocess.run(["llvm-objdump-22", "-d", "--mcpu=gfx950", str(path)], capture_output=True, text=True,
                         check=True).stdout
    return [line.split("//")[0].strip() for line in out.splitlines() if line.startswith("\t")]


def committed(name: str):
    import zyfa_kernels
    return zyfa_kernels.manifest().find(target="gfx950", name=name)


@pytest.mark.parametrize("name", NAMES)
def test_generation_and_assembly_are_deterministic(name):
    assert gfx950.generate(name) == text(name)
    assert gfx950.assemble(text(name)) == code_object(name)


def test_committed_objects_equal_a_fresh_build():
    assert build_driver.check(["gfx950"]) == []


@pytest.mark.parametrize("name", NAMES)
def test_manifest_entry_matches_the_code_object(name, tmp_path):
    entry = committed(name)
    path = tmp_path / f"{name}.co"
    path.write_bytes(code_object(name))
    info = gfx950.inspect(entry.fields, path)
    assert entry.symbol in info["symbols"] and f"{entry.symbol}.kd" in info["symbols"]
    assert entry.resources == info["resources"]
    res = info["resources"]
    assert entry.shared_bytes == res["lds"] == res["static_shared_bytes"] == gfx950.VARIANTS[name].lds_bytes
    assert res["lds"] <= LDS_LIMIT
    assert res["vgpr"] <= ARCH_VGPRS and res["agpr"] == 0 and res["waves_per_simd"] >= 2
    assert (entry.threads, entry.tile_m, entry.tile_n, entry.scale_block) == (512, 256, 64, 64)
    assert entry.layout.size <= res["kernarg_size"] == kernel.kernarg_bytes()


@pytest.mark.parametrize("name", NAMES)
def test_metadata_argument_offsets_follow_natural_alignment(name, tmp_path):
    path = tmp_path / f"{name}.co"
    path.write_bytes(code_object(name))
    notes = subprocess.run(["llvm-readelf-22", "--notes", str(path)], capture_output=True, text=True,
                           check=True).stdout
    declared = dict(re.findall(r"\.name:\s+(\w+)\s+\.offset:\s+(\d+)", notes))
    expected = {n: str(o) for n, o in kernel.arg_offsets().items()}
    assert declared == expected
    layout = committed(name).layout
    assert dict(zip(layout.names, layout.offsets, strict=True)) == kernel.arg_offsets()


@pytest.mark.parametrize("name", NAMES)
def test_register_table_has_no_undeclared_overlap_and_fits(name):
    table = gfx950.register_table(name)
    assert table.overlaps() == []
    assert table.count("v") <= ARCH_VGPRS
    for rng in table.ranges.values():
        if rng.alias_of:
            base = table.ranges[rng.alias_of]
            assert base.first <= rng.first and rng.last <= base.last
        if rng.count >= 2 and rng.file == "v" and rng.name not in ("k_ring_off",):
            assert rng.first % 2 == 0, f"{rng.name}: 64-bit operands need even VGPRs"
    header = [line for line in text(name).splitlines() if line.startswith("//   ")]
    assert len(header) == len(table.ranges)


def test_register_table_reports_an_accidental_overlap():
    from asmgen.gfx950.registers import RegisterTable
    table = RegisterTable()
    table.fixed("a", "v", 0, 4, "first")
    table.fixed("b", "v", 2, 4, "second")
    assert table.overlaps() == [("a", "b")]


@pytest.mark.parametrize("name", NAMES)
def test_hazard_windows_after_mfma_are_padded(name):
    assert hazards.check(text(name)) == []


def test_hazard_check_catches_a_missing_nop():
    lines = text("fp8_d128").splitlines()
    pv = next(i for i, line in enumerate(lines) if line.strip().startswith(kernel.MFMA) and "row sum" in line)
    nop = next(i for i in range(pv, len(lines)) if lines[i].strip().startswith("s_nop"))
    broken = "\n".join(lines[:nop] + lines[nop + 1:])
    assert hazards.check(broken)


@pytest.mark.parametrize("name", NAMES)
def test_only_agreed_instructions_are_used(name, tmp_path):
    used = set()
    for line in disassembly(name, tmp_path):
        mnemonic = re.sub(r"_e(32|64)$", "", line.split()[0])
        used.add(mnemonic)
    assert used - ALLOWED == set()
    assert "v_mfma_f32_32x32x64_f8f6f4" in used and "buffer_load_dwordx4" in used


@pytest.mark.parametrize("name", NAMES)
def test_sections_and_ring_structure(name):
    t = text(name)
    for title in ("prologue", "job loop", "load ring", "QK", "softmax", "PV", "epilogue"):
        assert f"// ==== {title}" in t
    v = gfx950.VARIANTS[name]
    loads = kernel.ring_loads(v.d_qk) + kernel.ring_loads(v.d_v)
    assert t.count(" lds\n") + t.count(" lds ") >= loads
    assert f"s_waitcnt vmcnt({(kernel.PREFETCH - 1) * loads})" in t
    assert f"s_waitcnt vmcnt({loads})" in t
    mfmas = sum(1 for line in t.splitlines() if line.strip().startswith(kernel.MFMA))
    # per copy of the unrolled key loop: QK of two key halves; PV of 4 d_v groups and one row-sum MFMA, on the
    # e = 0 path and on the scaled path
    assert mfmas == kernel.KEY_LOOP_UNROLL * (2 * v.qk_chunks + 2 * 5)


@pytest.mark.parametrize("fault,removed", [("drop_waitcnt", "s_waitcnt vmcnt("), ("drop_barrier", "s_barrier")])
def test_faults_remove_one_instruction(fault, removed):
    good, bad = text("fp8_d128"), text("fp8_d128", frozenset({fault}))
    count = lambda t: sum(1 for line in t.splitlines() if line.strip().startswith(removed))  # noqa: E731
    assert count(bad) == count(good) - 1
    gfx950.assemble(bad)


def test_bad_lds_offset_shifts_the_k_reads_by_one_row():
    bad = text("fp8_d192", frozenset({"bad_lds_offset"}))
    assert "v_add_u32 v5, 0xc0, v5" in bad.replace("192", "0xc0") or "FAULT: K read one row off" in bad
    assert gfx950.assemble(bad) != code_object("fp8_d192")


def test_unknown_fault_and_kernel_are_refused():
    with pytest.raises(ValueError, match="faults"):
        gfx950.generate("fp8_d128", frozenset({"no_such_fault"}))
    with pytest.raises(KeyError, match="kernel_name"):
        gfx950.generate("fp8_d96")


def test_lane_key_mapping_of_p_and_v_agree_and_cover_the_block():
    for half in range(2):
        keys = [kernel.key_of_slot(half, b) for b in range(32)]
        assert len(set(keys)) == 32
    both = {kernel.key_of_slot(h, b) for h in range(2) for b in range(32)}
    assert both == set(range(kernel.TILE_N))


def test_direct_to_lds_chunks_tile_each_waves_share():
    for row_bytes in (128, 192):
        chunk = kernel.ring_chunk_bytes(row_bytes)
        assert chunk in (4, 16)
        assert kernel.ring_loads(row_bytes) * kernel.WAVE_SIZE * chunk * kernel.WAVES == kernel.TILE_N * row_bytes


def test_schedule_analysis_counts_the_loop():
    steady = schedule.analyse(text("fp8_d128"))
    assert steady.counts["mfma"] == 9
    assert steady.matrix_cycles == 9 * 16 * schedule.MATRIX_CYCLES_PER_PASS
    assert 0 < steady.matrix_busy <= 1
    assert schedule.analyse(text("fp8_d128"), with_rescale=True).matrix_busy < steady.matrix_busy


def test_occupancy_model():
    assert toolchain.occupancy(256, 65536, 8) == {"workgroups_per_cu": 1, "waves_per_simd": 2}
    assert toolchain.occupancy(128, 65536, 8) == {"workgroups_per_cu": 2, "waves_per_simd": 4}
    assert toolchain.occupancy(128, 100000, 8) == {"workgroups_per_cu": 1, "waves_per_simd": 2}


def test_each_wave_transposes_the_v_rows_it_loads():
    """Under the ping-pong offset only a wave's own group has passed its load wait when V^T is built."""
    for wave in range(kernel.WAVES):
        assert kernel.v_share_keys(wave) == kernel.v_loaded_keys(wave, 128) == set(range(8 * wave, 8 * wave + 8))


def _fma(a, b, c):
    return fma_f32(*np.broadcast_arrays(np.float32(a), np.float32(b), np.float32(c)))


LEAN_SLOPE = np.float32(kernel.LEAN_CODE_PER_DOUBLING)  # 8
LEAN_OFFSET = np.float32(kernel.LEAN_CODE_MAX)  # 120


def _lean_codes_as_the_kernel(w):
    """The kernel's lean-P tail from w = fl(8y + 120): v_cvt_pk_u8_f32 rounds to nearest even and saturates."""
    with np.errstate(invalid="ignore"):
        return np.where(np.isnan(w), 0, np.clip(np.rint(w), 0, 255)).astype(np.uint8)


def test_lean_code_sequence_equals_the_model():
    """max(0, rne(8y + 120)) (P offset 2^8) from one FMA and the rounding, saturating byte conversion, bit for bit
    as zyfa.numerics with p_shift 8, ties and the saturation included; and the folded form for e >= 0
    (w = 8 (x - m) + (8e + 120)) equals y = (x - m) + e first."""
    assert kernel.P_SHIFT == 8 and kernel.LEAN_CODE_MAX == 120
    rng = np.random.default_rng(0)
    halves = ((np.arange(-130, 8) + 0.5 - kernel.LEAN_CODE_MAX) / 8).astype(np.float32)  # 8y + 120 half-integers
    near = np.concatenate([halves, np.nextafter(halves, np.float32(-np.inf)), np.nextafter(halves, np.float32(np.inf))])
    y = np.concatenate([rng.uniform(-18, 0, 200_000), -rng.exponential(1.0, 100_000), near,
                        [0.0, -np.inf, -1e30, -15.0625, -2.0**-20, -2.0**-30]]).astype(np.float32)
    y = y[y <= 0]
    codes = lambda y: numerics.lean_codes(torch.from_numpy(y), kernel.P_SHIFT).numpy()  # noqa: E731
    model = codes(y)
    assert model.max() == kernel.LEAN_CODE_MAX and model.min() == 0
    assert np.array_equal(_lean_codes_as_the_kernel(_fma(y, LEAN_SLOPE, LEAN_OFFSET)), model)

    for e in (0, 1, 2, 3, 7, 20, 1000):
        t = (-e - rng.uniform(0, 18, 50_000)).astype(np.float32)  # x - m <= -e for every key of the block
        t = np.concatenate([t, (near[near <= 0] - e).astype(np.float32), [np.float32(-e), np.float32(-np.inf)]])
        y_model = (t + np.float32(e)).astype(np.float32)
        assert np.array_equal(y_model.astype(np.float64), t.astype(np.float64) + e)  # exact, as the kernel assumes
        w_fold = _fma(t, LEAN_SLOPE, _fma(np.float32(e), LEAN_SLOPE, LEAN_OFFSET))
        assert np.array_equal(_lean_codes_as_the_kernel(w_fold), codes(y_model))


def test_schedule_cases_order_and_paths():
    """The e = 0 path is the shortest; the folded e >= 0 path skips y's 16 packed adds that e = -1 needs."""
    t = text("fp8_d128")
    cases = [schedule.analyse(t), schedule.analyse(t, scaled_pv=True),
             schedule.analyse(t, scaled_pv=True, negative_e=True),
             schedule.analyse(t, scaled_pv=True, negative_e=True, with_rescale=True)]
    cycles = [c.other_cycles for c in cases]
    assert cycles == sorted(cycles)
    assert cases[2].counts["valu"] - cases[1].counts["valu"] == 16 - 1  # y adds, less the 8e + 120 FMA
    body = schedule.steady_state_body(t)
    assert not any(line.startswith(("v_rndne_f32", "v_cvt_u32_f32")) for line in body)
