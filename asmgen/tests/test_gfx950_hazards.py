"""The gfx950 hazard table held to LLVM: llc-22's hazard recognizer pads a machine-IR instance of every pattern the
generator emits (and of every rule of the table), and the generator's table must ask for at least as many wait
states; the simulator raises one wait state short of the table and runs at the table's padding; the shipped kernels'
dependent pairs are all patterns of this catalogue."""

from __future__ import annotations

import re
import shutil
import subprocess
from functools import cache

import pytest

from asmgen import gfx950
from asmgen.gfx950 import hazards
from asmgen.sim import HazardError
from asmgen.sim.testing import run_snippet

LLC = "llc-22"
# One pattern: (rule, producer assembly, consumer assembly, producer MIR, consumer MIR). The assembly is the form
# the generator writes; the MIR the same instruction after register allocation, for llc's post-RA hazard pass.
V16 = "_".join(f"vgpr{i}" for i in range(32, 48))
V16_NEXT = "_".join(f"vgpr{i}" for i in range(48, 64))
V16_OVERLAP = "_".join(f"vgpr{i}" for i in range(40, 56))
A8, B8 = ("_".join(f"vgpr{i}" for i in range(b, b + 8)) for b in (0, 8))
MFMA_ASM = "v_mfma_f32_32x32x64_f8f6f4 v[32:47], v[0:7], v[8:15], {c}"


def mfma_mir(dst: str = V16, a: str = A8, c: str = "0") -> str:
    return (f"${dst} = V_MFMA_F32_32X32X64_F8F6F4_f8_f8_vgprcd_e64 ${a}, ${B8}, {c}, 0, 0, implicit $mode, "
            "implicit $exec")


def pk_mir(op: str, dst: str, srcs: list[str], src0_hi: int = 1) -> str:
    mods = [str(8 * src0_hi)] + ["8"] * (len(srcs) - 1)
    operands = ", ".join(f"{m}, ${s}" for m, s in zip(mods, srcs, strict=True))
    return f"${dst} = V_PK_{op}_F32 {operands}, 0, 0, 0, 0, 0, implicit $mode, implicit $exec"


PK_ADD_ASM = "v_pk_add_f32 v[0:1], v[0:1], v[2:3] op_sel_hi:[1,0]"
PK_ADD_MIR = pk_mir("ADD", "vgpr0_vgpr1", ["vgpr0_vgpr1", "vgpr2_vgpr3"])
PK_FMA_ASM = "v_pk_fma_f32 v[0:1], v[0:1], v[2:3], v[4:5] op_sel:[0,0,1] op_sel_hi:[1,0,1] clamp"
PK_FMA_MIR = pk_mir("FMA", "vgpr0_vgpr1", ["vgpr0_vgpr1", "vgpr2_vgpr3", "vgpr4_vgpr5"])
CMP_LE_ASM = "v_cmp_le_i32 vcc, 3, v10"
CMP_LE_MIR = "V_CMP_LE_I32_e32 3, $vgpr10, implicit-def $vcc, implicit $exec"
CMP_SGPR_ASM = "v_cmp_le_i32 s[68:69], 3, v10"
CMP_SGPR_MIR = "$sgpr68_sgpr69 = V_CMP_LE_I32_e64 3, $vgpr10, implicit $exec"
M0_ADD_MIR = "$m0 = S_ADD_U32 $sgpr5, 64, implicit-def $scc"
CVT_U8_MIR = "$vgpr8 = V_CVT_PK_U8_F32_e64 0, $vgpr0, 0, 0, 0, $vgpr8, 0, implicit $mode, implicit $exec"
PATTERNS = {
    "pk_add -> exp": ("dst_sel_valu", PK_ADD_ASM, "v_exp_f32 v0, v0", PK_ADD_MIR,
                      "$vgpr0 = V_EXP_F32_e32 $vgpr0, implicit $mode, implicit $exec"),
    "pk_add -> pk_add": ("dst_sel_valu", PK_ADD_ASM, PK_ADD_ASM, PK_ADD_MIR, PK_ADD_MIR),
    "pk_add -> pk_fma": ("dst_sel_valu", PK_ADD_ASM, PK_FMA_ASM, PK_ADD_MIR, PK_FMA_MIR),
    "pk_fma -> pk_add": ("dst_sel_valu", PK_FMA_ASM, PK_ADD_ASM, PK_FMA_MIR, PK_ADD_MIR),
    "pk_fma -> pk_fma": ("dst_sel_valu", PK_FMA_ASM, PK_FMA_ASM, PK_FMA_MIR, PK_FMA_MIR),
    "pk_fma -> perm": ("dst_sel_valu", PK_FMA_ASM, "v_perm_b32 v6, v1, v0, s70", PK_FMA_MIR,
                       "$vgpr6 = V_PERM_B32_e64 $vgpr1, $vgpr0, $sgpr70, implicit $exec"),
    "pk_mul -> cvt_pk_bf16": ("dst_sel_valu", "v_pk_mul_f32 v[0:1], v[2:3], v[0:1]", "v_cvt_pk_bf16_f32 v6, v0, v1",
                              pk_mir("MUL", "vgpr0_vgpr1", ["vgpr2_vgpr3", "vgpr0_vgpr1"]),
                              "$vgpr6 = V_CVT_PK_BF16_F32_e64 0, $vgpr0, 0, $vgpr1, 0, 0, implicit $mode, "
                              "implicit $exec"),
    "cvt_pk_fp8 op_sel -> valu": ("dst_sel_valu", "v_cvt_pk_fp8_f32 v1, v2, v3 op_sel:[0,0,1]", "v_mov_b32 v4, v1",
                                  "$vgpr1 = V_CVT_PK_FP8_F32_e64 8, $vgpr2, 0, $vgpr3, $vgpr1, 0, implicit $mode, "
                                  "implicit $exec", "$vgpr4 = V_MOV_B32_e32 $vgpr1, implicit $exec"),
    "pk_fma -> cvt_pk_u8": ("dst_sel_valu", "v_pk_fma_f32 v[0:1], v[0:1], v[2:3], v[4:5] op_sel_hi:[1,0,0]",
                            "v_cvt_pk_u8_f32 v8, v0, 0, 0", PK_FMA_MIR, CVT_U8_MIR),
    "cvt_pk_u8 -> cvt_pk_u8": ("none", "v_cvt_pk_u8_f32 v8, v0, 1, v8", "v_cvt_pk_u8_f32 v8, v1, 2, v8", CVT_U8_MIR,
                               CVT_U8_MIR.replace("$vgpr0, 0, 0", "$vgpr1, 0, 2")),
    "cvt_pk_u8 -> mfma a": ("valu_vgpr_mfma", "v_cvt_pk_u8_f32 v0, v20, 0, 0", MFMA_ASM.format(c=0),
                            "$vgpr0 = V_CVT_PK_U8_F32_e64 0, $vgpr20, 0, 0, 0, 0, 0, implicit $mode, implicit $exec",
                            mfma_mir()),
    "mfma -> fmac": ("mfma_write_read", MFMA_ASM.format(c=0), "v_fmac_f32 v60, v32, v62", mfma_mir(),
                     "$vgpr60 = V_FMAC_F32_e32 $vgpr32, $vgpr62, $vgpr60, implicit $mode, implicit $exec"),
    "mfma -> pk_fma": ("mfma_write_read", MFMA_ASM.format(c=0), "v_pk_fma_f32 v[60:61], v[32:33], v[62:63], v[60:61]",
                       mfma_mir(), pk_mir("FMA", "vgpr60_vgpr61", ["vgpr32_vgpr33", "vgpr62_vgpr63", "vgpr60_vgpr61"])),
    "mfma -> mfma a": ("mfma_write_read", MFMA_ASM.format(c=0), "v_mfma_f32_32x32x64_f8f6f4 v[48:63], v[32:39], "
                       "v[8:15], 0", mfma_mir(), mfma_mir(V16_NEXT, "_".join(f"vgpr{i}" for i in range(32, 40)))),
    "mfma -> mfma same c": ("none", MFMA_ASM.format(c=0), MFMA_ASM.format(c="v[32:47]"), mfma_mir(),
                            mfma_mir(c="$" + V16)),
    "mfma -> mfma overlapping c": ("mfma_write_srcc", MFMA_ASM.format(c=0), "v_mfma_f32_32x32x64_f8f6f4 v[40:55], "
                                   "v[0:7], v[8:15], v[40:55]", mfma_mir(), mfma_mir(V16_OVERLAP, c="$" + V16_OVERLAP)),
    "mfma -> valu write": ("mfma_write_read", MFMA_ASM.format(c=0), "v_mov_b32 v32, 0", mfma_mir(),
                           "$vgpr32 = V_MOV_B32_e32 0, implicit $exec"),
    "mfma c -> valu write": ("mfma_srcc_overwrite", MFMA_ASM.format(c="v[48:63]"), "v_mov_b32 v48, 0",
                             mfma_mir(c="$" + V16_NEXT), "$vgpr48 = V_MOV_B32_e32 0, implicit $exec"),
    "mfma -> buffer_store": ("mfma_write_read", MFMA_ASM.format(c=0), "buffer_store_dwordx2 v[32:33], v60, s[0:3], "
                             "s4 offen", mfma_mir(), "BUFFER_STORE_DWORDX2_OFFEN $vgpr32_vgpr33, $vgpr60, "
                             "$sgpr0_sgpr1_sgpr2_sgpr3, $sgpr4, 0, 0, 0, implicit $exec"),
    "mfma -> ds_write": ("mfma_write_read", MFMA_ASM.format(c=0), "ds_write_b32 v60, v32", mfma_mir(),
                         "DS_WRITE_B32_gfx9 $vgpr60, $vgpr32, 0, 0, implicit $exec"),
    "m0 -> buffer_load_dword lds": ("salu_m0_lds_dma", "s_mov_b32 m0, s5", "buffer_load_dword v1, s[0:3], s4 offen lds",
                                    "$m0 = S_MOV_B32 $sgpr5", "BUFFER_LOAD_DWORD_LDS_OFFEN $vgpr1, "
                                    "$sgpr0_sgpr1_sgpr2_sgpr3, $sgpr4, 0, 0, 0, implicit $exec, implicit $m0"),
    "m0 add -> buffer_load_dword lds": ("salu_m0_lds_dma", "s_add_u32 m0, s5, 64",
                                        "buffer_load_dword v1, s[0:3], s4 offen lds", M0_ADD_MIR,
                                        "BUFFER_LOAD_DWORD_LDS_OFFEN $vgpr1, $sgpr0_sgpr1_sgpr2_sgpr3, $sgpr4, 0, 0, "
                                        "0, implicit $exec, implicit $m0"),
    "m0 add -> buffer_load_dwordx4 lds": ("salu_m0_lds_dma", "s_add_u32 m0, s5, 64",
                                          "buffer_load_dwordx4 v1, s[0:3], s4 offen lds", M0_ADD_MIR,
                                          "BUFFER_LOAD_DWORDX4_LDS_OFFEN $vgpr1, $sgpr0_sgpr1_sgpr2_sgpr3, $sgpr4, "
                                          "0, 0, 0, implicit $exec, implicit $m0"),
    "m0 -> buffer_load_dwordx4 lds": ("salu_m0_lds_dma", "s_mov_b32 m0, s5",
                                      "buffer_load_dwordx4 v1, s[0:3], s4 offen lds", "$m0 = S_MOV_B32 $sgpr5",
                                      "BUFFER_LOAD_DWORDX4_LDS_OFFEN $vgpr1, $sgpr0_sgpr1_sgpr2_sgpr3, $sgpr4, 0, 0, "
                                      "0, implicit $exec, implicit $m0"),
    "exp -> pk_mul": ("trans_valu", "v_exp_f32 v0, v0", "v_pk_mul_f32 v[0:1], v[2:3], v[0:1] op_sel_hi:[0,1]",
                      "$vgpr0 = V_EXP_F32_e32 $vgpr0, implicit $mode, implicit $exec",
                      pk_mir("MUL", "vgpr0_vgpr1", ["vgpr2_vgpr3", "vgpr0_vgpr1"], src0_hi=0)),
    "log -> add": ("trans_valu", "v_log_f32 v1, v2", "v_add_f32 v1, 0xc1000000, v1",
                   "$vgpr1 = V_LOG_F32_e32 $vgpr2, implicit $mode, implicit $exec",
                   "$vgpr1 = V_ADD_F32_e32 3238002688, $vgpr1, implicit $mode, implicit $exec"),
    "log -> mul": ("trans_valu", "v_log_f32 v1, v2", "v_mul_f32 v1, 0x3f317218, v1",
                   "$vgpr1 = V_LOG_F32_e32 $vgpr2, implicit $mode, implicit $exec",
                   "$vgpr1 = V_MUL_F32_e32 1060205080, $vgpr1, implicit $mode, implicit $exec"),
    "rcp -> mul": ("trans_valu", "v_rcp_f32 v1, v2", "v_mul_f32 v3, s90, v1",
                   "$vgpr1 = V_RCP_F32_e32 $vgpr2, implicit $mode, implicit $exec",
                   "$vgpr3 = V_MUL_F32_e32 $sgpr90, $vgpr1, implicit $mode, implicit $exec"),
    "cmp vcc -> cndmask": ("valu_sgpr_valu", CMP_LE_ASM, "v_cndmask_b32 v88, v13, v88, vcc", CMP_LE_MIR,
                           "$vgpr88 = V_CNDMASK_B32_e32 $vgpr13, $vgpr88, implicit $vcc, implicit $exec"),
    "cmp sgpr pair -> cndmask": ("valu_sgpr_valu", CMP_SGPR_ASM, "v_cndmask_b32 v88, v13, v88, s[68:69]",
                                 CMP_SGPR_MIR, "$vgpr88 = V_CNDMASK_B32_e64 0, $vgpr13, 0, $vgpr88, $sgpr68_sgpr69, "
                                 "implicit $exec"),
    "cmp gt -> cndmask": ("valu_sgpr_valu", "v_cmp_gt_f32 s[68:69], v15, v14",
                          "v_cndmask_b32 v18, v13, v15, s[68:69]",
                          "$sgpr68_sgpr69 = V_CMP_GT_F32_e64 0, $vgpr15, 0, $vgpr14, 0, implicit $mode, implicit $exec",
                          "$vgpr18 = V_CNDMASK_B32_e64 0, $vgpr13, 0, $vgpr15, $sgpr68_sgpr69, implicit $exec"),
    "cvt_pk_fp8 -> mfma b": ("valu_vgpr_mfma", "v_cvt_pk_fp8_f32 v8, v2, v3", MFMA_ASM.format(c=0),
                             "$vgpr8 = V_CVT_PK_FP8_F32_e64 0, $vgpr2, 0, $vgpr3, $vgpr8, 0, implicit $mode, "
                             "implicit $exec", mfma_mir()),
    "perm -> mfma a": ("valu_vgpr_mfma", "v_perm_b32 v0, v1, v2, s70", MFMA_ASM.format(c=0),
                       "$vgpr0 = V_PERM_B32_e64 $vgpr1, $vgpr2, $sgpr70, implicit $exec", mfma_mir()),
    "mov -> permlane32_swap": ("valu_vgpr_permlane_swap", "v_mov_b32 v3, v4", "v_permlane32_swap_b32 v3, v3",
                               "$vgpr3 = V_MOV_B32_e32 $vgpr4, implicit $exec",
                               "$vgpr3, $vgpr3 = V_PERMLANE32_SWAP_B32_e32 $vgpr3, $vgpr3, implicit $exec"),
    "lshrrev -> readfirstlane": ("valu_vgpr_readlane", "v_lshrrev_b32 v20, 6, v0", "v_readfirstlane_b32 s76, v20",
                                 "$vgpr20 = V_LSHRREV_B32_e32 6, $vgpr0, implicit $exec",
                                 "$sgpr76 = V_READFIRSTLANE_B32 $vgpr20, implicit $exec"),
    # rules of the table that the shipped kernels do not meet, held to LLVM all the same
    "readfirstlane -> buffer soffset": ("valu_sgpr_vmem", "v_readfirstlane_b32 s4, v20",
                                        "buffer_store_dword v32, v60, s[0:3], s4 offen",
                                        "$sgpr4 = V_READFIRSTLANE_B32 $vgpr20, implicit $exec",
                                        "BUFFER_STORE_DWORD_OFFEN $vgpr32, $vgpr60, $sgpr0_sgpr1_sgpr2_sgpr3, "
                                        "$sgpr4, 0, 0, 0, implicit $exec"),
    "readfirstlane -> readlane select": ("valu_sgpr_lane_select", "v_readfirstlane_b32 s4, v20",
                                         "v_readlane_b32 s6, v7, s4",
                                         "$sgpr4 = V_READFIRSTLANE_B32 $vgpr20, implicit $exec",
                                         "$sgpr6 = V_READLANE_B32 $vgpr7, $sgpr4, implicit $exec"),
    "cmp exec -> mfma": ("valu_exec_mfma_or_lane", "v_cmp_gt_f32 exec, v1, v2", MFMA_ASM.format(c=0),
                         "$exec = V_CMP_GT_F32_e64 0, $vgpr1, 0, $vgpr2, 0, implicit $mode, implicit $exec",
                         mfma_mir()),
    "readfirstlane -> valu sgpr": ("valu_sgpr_valu", "v_readfirstlane_b32 s76, v20", "v_add_u32 v6, s76, v7",
                                   "$sgpr76 = V_READFIRSTLANE_B32 $vgpr20, implicit $exec",
                                   "$vgpr6 = V_ADD_U32_e32 $sgpr76, $vgpr7, implicit $exec"),
    "cmp -> salu": ("none", "v_cmp_gt_f32 s[68:69], v15, v14", "s_or_b32 s92, s68, s69",
                    "$sgpr68_sgpr69 = V_CMP_GT_F32_e64 0, $vgpr15, 0, $vgpr14, 0, implicit $mode, implicit $exec",
                    "$sgpr92 = S_OR_B32 $sgpr68, $sgpr69, implicit-def $scc"),
}
MIR = """---
name: pattern
tracksRegLiveness: false
body: |
  bb.0:
    {producer}
    {consumer}
    S_ENDPGM 0
...
"""


@cache
def llvm_wait_states(producer_mir: str, consumer_mir: str) -> int:
    """Wait states llc-22's post-RA hazard recognizer puts between the two instructions (gfx950)."""
    out = subprocess.run([LLC, "-mtriple=amdgcn-amd-amdhsa", "-mcpu=gfx950", "-run-pass=post-RA-hazard-rec",
                          "-x", "mir", "-o", "-", "-"], input=MIR.format(producer=producer_mir, consumer=consumer_mir),
                         capture_output=True, text=True, check=True).stdout
    return sum(int(n) + 1 for n in re.findall(r"S_NOP (\d+)", out.split("bb.0:")[1]))


def table_wait_states(producer: str, consumer: str) -> tuple[int, str]:
    tracker = hazards.Tracker()
    tracker.issue(producer)
    return tracker.needed(consumer)


needs_llc = pytest.mark.skipif(shutil.which(LLC) is None, reason=f"{LLC} is not installed (CI installs LLVM 22)")


@needs_llc
@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_table_asks_for_at_least_what_llvm_inserts(name):
    rule, producer, consumer, producer_mir, consumer_mir = PATTERNS[name]
    llvm = llvm_wait_states(producer_mir, consumer_mir)
    table, table_rule = table_wait_states(producer, consumer)
    assert table >= llvm, f"{name}: the table asks for {table} wait states, llc-22 inserts {llvm}"
    assert (table_rule or "none") == rule and (llvm > 0) == (rule != "none"), (name, table_rule, llvm)


@pytest.mark.parametrize("name", sorted(n for n, p in PATTERNS.items() if p[0] != "none"))
def test_simulator_raises_one_wait_state_short(name):
    rule, producer, consumer, _, _ = PATTERNS[name]
    required, _ = table_wait_states(producer, consumer)
    # a buffer resource s[0:3] on the output table, soffset s4 = 0, M0 source s5 = 0
    setup = "  s_mov_b64 s[0:1], s[6:7]\n  s_mov_b32 s2, -1\n  s_mov_b32 s3, 0x20000\n  s_mov_b64 s[4:5], 0\n"
    body = setup + f"  {producer}\n" + "  s_nop 0\n" * (required - 1) + f"  {consumer}\n  s_nop 15\n  s_nop 15\n"
    if "exec" in producer:
        body += "  s_mov_b64 exec, -1\n"
    with pytest.raises(HazardError, match=rf"\({rule}\).* after {required - 1} wait states; {required} required"):
        run_snippet(body, None, 1, vgprs=128, lds_bytes=4096)
    run_snippet(body.replace(f"  {producer}\n", f"  {producer}\n  s_nop 0\n", 1), None, 1, vgprs=128,
                lds_bytes=4096)


def kernel_dependences(text: str) -> set[tuple[str, str, str]]:
    """(rule, producer mnemonic, consumer mnemonic) of every pair of the text within the longest window whose
    rule asks for wait states (straight-line order, labels ignored: a superset of the executed pairs)."""
    found, history = set(), []
    for line in text.splitlines():
        code = line.split("//")[0].strip()
        if not code or code.startswith(".") or code.endswith(":"):
            continue
        mnemonic, ops = hazards.split_operands(code)
        states = int(ops[0], 0) + 1 if mnemonic == "s_nop" else 1
        if mnemonic != "s_nop":
            consumer = hazards.facts(code)
            for _, producer in history:
                wait, rule = hazards.required_wait(producer, consumer)
                if wait:
                    found.add((rule, producer.mnemonic, consumer.mnemonic))
        history = [(e + states, p) for e, p in history if e + states <= hazards.LONGEST]
        if mnemonic != "s_nop":
            history.append((0, hazards.facts(code)))
    return found


@pytest.mark.parametrize("name", sorted(gfx950.VARIANTS))
def test_every_dependence_of_the_kernels_is_a_pattern_held_to_llvm(name):
    catalogue = {(rule, hazards.split_operands(p)[0], hazards.split_operands(c)[0])
                 for rule, p, c, _, _ in PATTERNS.values()}
    missing = kernel_dependences(gfx950.generate(name)) - catalogue
    assert not missing, f"patterns without an LLVM check: {sorted(missing)}"


def test_causal_mask_and_wave_id_are_padded():
    """The two defects of the first objects: each v_cndmask of the mask reads a VCC/SGPR mask written 2 or more
    wait states before, and v_readfirstlane of the wave id waits 1 after its v_lshrrev."""
    text = gfx950.generate("fp8_d128")
    assert hazards.check(text) == []
    lines = [line.split("//")[0].strip() for line in text.splitlines()]
    first = next(i for i, line in enumerate(lines) if line.startswith("v_readfirstlane_b32"))
    assert lines[first - 1].startswith("s_nop") and lines[first - 2].startswith("v_lshrrev_b32")
    assert sum(line.startswith("v_cndmask_b32") and line.endswith(("vcc", "]")) for line in lines) >= 128
