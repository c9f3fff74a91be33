"""Running small hand-written gfx950 assembly snippets in the simulator (used by the instruction-level tests).

A snippet kernel gets two pointers: s[4:5] = input, s[6:7] = output, each a table of 32-bit registers laid out
register-major (register i of lane l at byte 256*i + 4*l), and v1 = 4 * lane id. `load_input(vreg, i)` and
`store_output(vreg, i)` write the instructions that move register i of that table.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

import numpy as np

from .errors import SimError
from .machine import load
from .memory import Memory
from .wave import LANES

CLANG_CANDIDATES = ("clang-22", "clang")
SNIPPET_SYMBOL = "snippet"
TABLE_ROW_BYTES = 4 * LANES

PROLOGUE = """\
  s_load_dwordx4 s[4:7], s[0:1], 0x0
  s_waitcnt lgkmcnt(0)
  v_lshlrev_b32 v1, 2, v0
"""


def assemble(source: str) -> bytes:
    """Assemble and link gfx950 assembly text into a code object with clang."""
    clang = next((c for c in CLANG_CANDIDATES if shutil.which(c)), None)
    if clang is None:
        raise SimError(f"none of {CLANG_CANDIDATES} found on PATH (needed to assemble)")
    with tempfile.TemporaryDirectory() as tmp:
        src, out = os.path.join(tmp, "k.s"), os.path.join(tmp, "k.co")
        with open(src, "w") as f:
            f.write(source)
        result = subprocess.run([clang, "-x", "assembler", "-target", "amdgcn-amd-amdhsa", "-mcpu=gfx950", src,
                                 "-o", out], capture_output=True, text=True)
        if result.returncode:
            raise SimError(f"assembly failed:\n{result.stderr}")
        with open(out, "rb") as f:
            return f.read()


def snippet_source(body: str, *, vgprs: int = 64, agprs: int = 0, lds_bytes: int = 0,
                   float_denorm_mode_32: int | None = None) -> str:
    total = vgprs + agprs
    return f"""\
.amdgcn_target "amdgcn-amd-amdhsa--gfx950"
.text
.globl {SNIPPET_SYMBOL}
.p2align 8
.type {SNIPPET_SYMBOL},@function
{SNIPPET_SYMBOL}:
{PROLOGUE}{body}
  s_endpgm
.rodata
.p2align 6
.amdhsa_kernel {SNIPPET_SYMBOL}
  .amdhsa_user_sgpr_kernarg_segment_ptr 1
  .amdhsa_next_free_vgpr {total}
  .amdhsa_next_free_sgpr 32
  .amdhsa_accum_offset {vgprs}
  .amdhsa_group_segment_fixed_size {lds_bytes}
  .amdhsa_system_sgpr_workgroup_id_x 1
  .amdhsa_kernarg_size 16
{"" if float_denorm_mode_32 is None else f"  .amdhsa_float_denorm_mode_32 {float_denorm_mode_32}"}
.end_amdhsa_kernel
"""


MAX_OFFSET_ROWS = 16  # rows reachable through the 13-bit signed instruction offset
ROW_BASE = "s[28:29]"  # scratch SGPR pair for rows beyond that


def _row_access(op: str, base: str, data: str, vreg_first: bool, i: int) -> str:
    operands = f"v{data}, v1" if vreg_first else f"v1, v{data}"
    if i < MAX_OFFSET_ROWS:
        return f"  {op} {operands}, {base} offset:{TABLE_ROW_BYTES * i}\n"
    lo, hi = (int(x) for x in base[2:-1].split(":"))
    return (f"  s_add_u32 s28, s{lo}, {TABLE_ROW_BYTES * i}\n  s_addc_u32 s29, s{hi}, 0\n"
            f"  {op} {operands}, {ROW_BASE}\n")


def load_input(vreg: int, i: int) -> str:
    """Load register i of the input table into v{vreg} (s[28:29] is clobbered for i >= 16)."""
    return _row_access("global_load_dword", "s[4:5]", str(vreg), True, i)


def store_output(vreg: int, i: int) -> str:
    """Store v{vreg} as register i of the output table (s[28:29] is clobbered for i >= 16)."""
    return _row_access("global_store_dword", "s[6:7]", str(vreg), False, i)


def run_snippet(body: str, inputs: np.ndarray | None = None, outputs: int = 1, *, vgprs: int = 64,
                agprs: int = 0, lds_bytes: int = 0, threads: int = LANES, float_denorm_mode_32: int | None = None,
                **launch) -> np.ndarray:
    """Assemble `body` into a snippet kernel, run one workgroup, return the output table (outputs, 64) uint32."""
    program = load(assemble(snippet_source(body, vgprs=vgprs, agprs=agprs, lds_bytes=lds_bytes,
                                           float_denorm_mode_32=float_denorm_mode_32)))
    memory = Memory()
    table = np.zeros((1, LANES), np.uint32) if inputs is None else np.asarray(inputs).view(np.uint32)
    src = memory.put(np.ascontiguousarray(table, dtype=np.uint32))
    dst = memory.alloc(outputs * TABLE_ROW_BYTES)
    kernarg = np.array([src, dst], dtype=np.uint64).tobytes()
    program.launch(SNIPPET_SYMBOL, (1, 1, 1), (threads, 1, 1), kernarg, memory, **launch)
    return memory.read(dst, outputs * TABLE_ROW_BYTES).view(np.uint32).reshape(outputs, LANES)
