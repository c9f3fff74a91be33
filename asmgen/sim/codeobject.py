"""Reading a gfx950 code object: ELF symbols, the kernel descriptor, and the decoded instruction stream.

Decoding uses LLVM's disassembler (`llvm-objdump -d --mcpu=gfx950`), whose text the decoder below turns into
Instruction records; the raw instruction words printed beside each line are kept for fields whose text form is
ambiguous (s_waitcnt counters, branch offsets).
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import tempfile
from dataclasses import dataclass, field

from .errors import SimError

OBJDUMP_CANDIDATES = ("llvm-objdump-22", "llvm-objdump")

# Kernel descriptor (AMDGPU code object v5/v6, 64 bytes, see LLVM AMDGPUUsage "Kernel Descriptor").
KD_SIZE = 64
KD_GROUP_SEGMENT = 0
KD_PRIVATE_SEGMENT = 4
KD_KERNARG_SIZE = 8
KD_ENTRY_OFFSET = 16
KD_RSRC3 = 44
KD_RSRC1 = 48
KD_RSRC2 = 52
KD_CODE_PROPERTIES = 56
KD_KERNARG_PRELOAD = 58
VGPR_GRANULE = 8  # unified VGPR+AGPR allocation granule of gfx90a-class targets
# COMPUTE_PGM_RSRC1.FLOAT_DENORM_MODE_32 (bits 17:16) values
FLUSH_SRC_DST, FLUSH_DST, FLUSH_SRC, FLUSH_NONE = 0, 1, 2, 3


@dataclass(frozen=True)
class KernelDescriptor:
    """What the dispatcher reads from a kernel descriptor to start the waves of one workgroup."""
    group_segment_size: int
    private_segment_size: int
    kernarg_size: int
    entry_offset: int
    vgpr_count: int  # unified file: ArchVGPRs then AGPRs
    accum_offset: int  # first AGPR in the unified file
    user_sgpr_count: int
    user_sgprs: tuple[tuple[str, int], ...]  # (name, count) in the order the dispatcher loads them
    workgroup_id_sgprs: tuple[bool, bool, bool]
    workgroup_info_sgpr: bool
    workitem_id_dims: int  # 1 = x, 2 = x,y, 3 = x,y,z (packed into v0 on gfx950)
    ieee_mode: bool
    dx10_clamp: bool
    float_denorm_mode_32: int = FLUSH_NONE  # FP32 denormals: 0 flush inputs and results, 1 results, 2 inputs, 3 keep

    @property
    def flush_f32_inputs(self) -> bool:
        return self.float_denorm_mode_32 in (FLUSH_SRC_DST, FLUSH_SRC)

    @property
    def flush_f32_results(self) -> bool:
        return self.float_denorm_mode_32 in (FLUSH_SRC_DST, FLUSH_DST)

    @classmethod
    def parse(cls, raw: bytes) -> KernelDescriptor:
        if len(raw) != KD_SIZE:
            raise SimError(f"kernel descriptor must be {KD_SIZE} bytes, got {len(raw)}")
        (group,) = struct.unpack_from("<I", raw, KD_GROUP_SEGMENT)
        (private,) = struct.unpack_from("<I", raw, KD_PRIVATE_SEGMENT)
        (kernarg,) = struct.unpack_from("<I", raw, KD_KERNARG_SIZE)
        (entry,) = struct.unpack_from("<q", raw, KD_ENTRY_OFFSET)
        rsrc3, rsrc1, rsrc2 = struct.unpack_from("<III", raw, KD_RSRC3)
        (props,) = struct.unpack_from("<H", raw, KD_CODE_PROPERTIES)
        (preload,) = struct.unpack_from("<H", raw, KD_KERNARG_PRELOAD)
        if preload & 0x7F:
            raise SimError("kernarg preloading (.amdhsa_user_sgpr_kernarg_preload_length) is not modelled")
        user = []
        for bit, name, count in ((0, "private_segment_buffer", 4), (1, "dispatch_ptr", 2), (2, "queue_ptr", 2),
                                 (3, "kernarg_segment_ptr", 2), (4, "dispatch_id", 2), (5, "flat_scratch_init", 2),
                                 (6, "private_segment_size", 1)):
            if props >> bit & 1:
                user.append((name, count))
        return cls(
            group_segment_size=group,
            private_segment_size=private,
            kernarg_size=kernarg,
            entry_offset=entry,
            vgpr_count=((rsrc1 & 0x3F) + 1) * VGPR_GRANULE,
            accum_offset=((rsrc3 & 0x3F) + 1) * 4,
            user_sgpr_count=(rsrc2 >> 1) & 0x1F,
            user_sgprs=tuple(user),
            workgroup_id_sgprs=(bool(rsrc2 >> 7 & 1), bool(rsrc2 >> 8 & 1), bool(rsrc2 >> 9 & 1)),
            workgroup_info_sgpr=bool(rsrc2 >> 10 & 1),
            workitem_id_dims=((rsrc2 >> 11) & 3) + 1,
            ieee_mode=bool(rsrc1 >> 23 & 1),
            dx10_clamp=bool(rsrc1 >> 21 & 1),
            float_denorm_mode_32=(rsrc1 >> 16) & 3,
        )


@dataclass
class Operand:
    """One source or destination operand as the disassembler prints it."""
    kind: str  # "v", "a", "s" (register files; s includes vcc/exec/m0 by encoding index), "imm", "scc", "off"
    index: int = 0  # first register, or the immediate's 32-bit pattern
    count: int = 1  # registers covered
    neg: bool = False
    abs: bool = False
    is_float: bool = False  # immediate written as a floating-point constant
    value: float = 0.0  # the immediate as written (for 64-bit operands)

    @property
    def regs(self) -> range:
        return range(self.index, self.index + self.count)


@dataclass
class Instruction:
    addr: int
    name: str  # mnemonic without the _e32 / _e64 encoding suffix
    encoding: str  # "e32", "e64" or ""
    operands: list[Operand]
    mods: dict = field(default_factory=dict)
    words: tuple[int, ...] = ()
    text: str = ""

    @property
    def size(self) -> int:
        return 4 * len(self.words)

    def __str__(self) -> str:
        return self.text


# Special scalar operands at their SGPR encoding index (GCN/CDNA operand encoding).
SPECIAL_SGPRS = {"vcc_lo": (106, 1), "vcc_hi": (107, 1), "vcc": (106, 2), "m0": (124, 1),
                 "exec_lo": (126, 1), "exec_hi": (127, 1), "exec": (126, 2),
                 "flat_scratch_lo": (102, 1), "flat_scratch_hi": (103, 1), "flat_scratch": (102, 2)}
INV_2PI = 0.15915494
INLINE_FLOATS_32 = {0.5: 0x3F000000, -0.5: 0xBF000000, 1.0: 0x3F800000, -1.0: 0xBF800000, 2.0: 0x40000000,
                    -2.0: 0xC0000000, 4.0: 0x40800000, -4.0: 0xC0800000, INV_2PI: 0x3E22F983}
REGISTER = re.compile(r"^([vas]|ttmp)(\d+)$")
REGISTER_RANGE = re.compile(r"^([vas]|ttmp)\[(\d+):(\d+)\]$")
BRACKET_MOD = re.compile(r"\b(op_sel|op_sel_hi|neg_lo|neg_hi|bound_ctrl|fi)\s*:\s*\[([^\]]*)\]")
TTMP_BASE = 108


def parse_operand(token: str) -> Operand:
    token = token.strip()
    neg = absolute = False
    if token.startswith("-") and not re.match(r"^-[\d.]", token):
        neg, token = True, token[1:]
    if token.startswith("neg(") and token.endswith(")"):
        neg, token = True, token[4:-1]
    if token.startswith("|") and token.endswith("|"):
        absolute, token = True, token[1:-1]
    if token.startswith("abs(") and token.endswith(")"):
        absolute, token = True, token[4:-1]
    if m := REGISTER.match(token):
        kind, index = m.group(1), int(m.group(2))
        return _register(kind, index, 1, neg, absolute)
    if m := REGISTER_RANGE.match(token):
        kind, lo, hi = m.group(1), int(m.group(2)), int(m.group(3))
        return _register(kind, lo, hi - lo + 1, neg, absolute)
    if token in SPECIAL_SGPRS:
        index, count = SPECIAL_SGPRS[token]
        return Operand("s", index, count, neg, absolute)
    if token in ("scc", "src_scc"):
        return Operand("scc", neg=neg, abs=absolute)
    if token == "off":
        return Operand("off")
    if re.match(r"^-?0x[0-9a-fA-F]+$", token):
        value = int(token, 16)
        return Operand("imm", value & 0xFFFFFFFF, neg=neg, abs=absolute, value=value)
    if re.match(r"^-?\d+$", token):
        value = int(token)
        return Operand("imm", value & 0xFFFFFFFF, neg=neg, abs=absolute, value=value)
    if re.match(r"^-?\d+\.\d*(e[-+]?\d+)?$", token):
        value = float(token)
        pattern = INLINE_FLOATS_32.get(value)
        if pattern is None:
            raise SimError(f"unexpected floating-point constant {token!r}")
        return Operand("imm", pattern, neg=neg, abs=absolute, is_float=True, value=value)
    raise SimError(f"cannot parse operand {token!r}")


def _register(kind: str, index: int, count: int, neg: bool, absolute: bool) -> Operand:
    if kind == "ttmp":
        return Operand("s", TTMP_BASE + index, count, neg, absolute)
    return Operand(kind, index, count, neg, absolute)


def parse_line(addr: int, words: tuple[int, ...], asm: str) -> Instruction:
    """Split `mnemonic operands modifiers` as printed by llvm-objdump into an Instruction."""
    text = asm.strip()
    mnemonic, _, rest = text.partition(" ")
    mods: dict = {}
    for m in BRACKET_MOD.finditer(rest):
        mods[m.group(1)] = tuple(int(x) for x in m.group(2).split(","))
    rest = BRACKET_MOD.sub("", rest).strip()
    encoding = ""
    name = mnemonic
    for suffix in ("_e32", "_e64", "_sdwa", "_dpp"):
        if name.endswith(suffix):
            name, encoding = name[: -len(suffix)], suffix[1:]
    if encoding in ("sdwa", "dpp"):
        raise SimError(f"{addr:#x}: {encoding.upper()} forms are not modelled: {text}")
    if name in ("s_waitcnt", "s_endpgm", "s_barrier") or name.startswith("s_cbranch") or name == "s_branch":
        return Instruction(addr, name, encoding, [], mods, words, text)
    parts = [p.strip() for p in rest.split(",")] if rest else []
    if parts:
        tail = parts[-1].split()
        parts[-1] = tail[0]
        for token in tail[1:]:
            key, sep, value = token.partition(":")
            mods[key] = int(value, 0) if sep else True
    operands = [parse_operand(p) for p in parts if p]
    return Instruction(addr, name, encoding, operands, mods, words, text)


LINE = re.compile(r"^\s+(\S.*?)\s*//\s*([0-9A-Fa-f]{12,16}):\s*((?:[0-9A-Fa-f]{8}\s*)+)")


def disassemble(path: str) -> list[Instruction]:
    """Decode the .text section of a code object file into instructions in address order."""
    tool = next((t for t in OBJDUMP_CANDIDATES if shutil.which(t)), None)
    if tool is None:
        raise SimError(f"none of {OBJDUMP_CANDIDATES} found on PATH (needed to decode the code object)")
    out = subprocess.run([tool, "-d", "--mcpu=gfx950", "--section=.text", path],
                         check=True, capture_output=True, text=True).stdout
    instructions = []
    for line in out.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        asm, addr, words = m.group(1), int(m.group(2), 16), tuple(int(w, 16) for w in m.group(3).split())
        instructions.append(parse_line(addr, words, asm))
    return instructions


@dataclass
class Elf:
    """The parts of a relocatable/shared AMDGPU ELF the simulator needs: sections and defined symbols."""
    data: bytes
    sections: dict[str, tuple[int, int, int]]  # name -> (virtual address, file offset, size)
    symbols: dict[str, int]  # name -> virtual address

    @classmethod
    def parse(cls, data: bytes) -> Elf:
        if data[:4] != b"\x7fELF" or data[4] != 2:
            raise SimError("not a 64-bit ELF code object")
        shoff, = struct.unpack_from("<Q", data, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
        headers = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
        names_off = headers[shstrndx][4]

        def cstr(off: int) -> str:
            return data[off:data.index(b"\0", off)].decode()

        sections = {cstr(names_off + h[0]): (h[3], h[4], h[5]) for h in headers}
        symbols = {}
        for h in headers:
            if h[1] in (2, 11):  # SHT_SYMTAB, SHT_DYNSYM
                strtab = headers[h[6]][4]
                for off in range(h[4], h[4] + h[5], 24):
                    name_off, _info, _other, shndx, value, _size = struct.unpack_from("<IBBHQQ", data, off)
                    if shndx and name_off:
                        symbols[cstr(strtab + name_off)] = value
        return cls(data, sections, symbols)

    def read(self, addr: int, size: int) -> bytes:
        for vaddr, off, length in self.sections.values():
            if vaddr and vaddr <= addr and addr + size <= vaddr + length:
                return self.data[off + addr - vaddr: off + addr - vaddr + size]
        raise SimError(f"address {addr:#x}+{size} is not inside any loaded section")


def decode_code_object(data: bytes) -> tuple[Elf, list[Instruction]]:
    elf = Elf.parse(data)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.co")
        with open(path, "wb") as f:
            f.write(data)
        return elf, disassemble(path)
