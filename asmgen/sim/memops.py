"""Memory instructions: scalar loads (SMEM), LDS (DS), buffer (MUBUF, incl. direct-to-LDS) and global (FLAT global).

Every one of them completes late: the issuing wave records a Pending operation on its vmcnt (VMEM) or lgkmcnt
(LDS, SMEM) counter, and its effect lands only when s_waitcnt (or the configured latency, or counter overflow) retires
it. Loads read memory when they complete, stores read their data registers at issue and write when they complete,
so a missing wait reads stale registers and a missing barrier lets another wave's later write be seen.
"""

from __future__ import annotations

import numpy as np

from .errors import MemoryFault, SimError
from .isa import LDS, SMEM, VMEM_LOAD, VMEM_STORE, define
from .memory import BufferResource
from .wave import LANES, M0

DWORDS = {"dword": 1, "dwordx2": 2, "dwordx4": 4, "dwordx8": 8}
STORE_SHORT_BYTES = 2
LDS_DMA_M0_MASK = 0x3FFFF  # M0 bits holding the LDS byte address of a direct-to-LDS load (160 KiB needs 18)


def _rows_to_regs(rows: np.ndarray, dwords: int) -> np.ndarray:
    """uint8 (lanes, 4*dwords) -> uint32 (dwords, lanes)."""
    return np.ascontiguousarray(rows).view(np.uint32).reshape(LANES, dwords).T


def _regs_to_rows(w, op, dwords: int) -> np.ndarray:
    return np.stack([w.vread(op, i) for i in range(dwords)], axis=1).view(np.uint8).reshape(LANES, 4 * dwords)


def _write_regs(w, op, regs: np.ndarray, mask: np.ndarray) -> None:
    for i, row in enumerate(regs):
        w.vwrite(op, row, i, mask=mask)


# --- SMEM ---------------------------------------------------------------------------------------------------------
@define([f"s_load_{k}" for k in DWORDS], SMEM, "PCODE {NAME} (address = SBASE + offset, dword aligned)")
def s_load(w, ins, ctx):
    dst, base, off = ins.operands
    dwords = DWORDS[ins.name.split("_")[-1]]
    addr = (w.sread(base, 64) + w.sread(off)) & ~3

    def complete():
        data = ctx.memory.read(addr, 4 * dwords).view(np.uint32)
        for i, value in enumerate(data):
            w.s[dst.index + i] = int(value)
    ctx.issue(w, ins, complete)


# --- LDS ----------------------------------------------------------------------------------------------------------
def _lds_addresses(w, ins, ctx, size: int) -> np.ndarray:
    # A 32-bit sum that wraps: LLVM folds constant offsets into DS instructions whose base may be "negative"
    # (AMDGPUDAGToDAGISel::isDSOffsetLegal: only Southern Islands needs a non-negative base).
    base = w.vread(ins.operands[0 if "write" in ins.name else 1]).astype(np.int64)
    addr = (base + ins.mods.get("offset", 0)) & 0xFFFFFFFF
    _check_lds(ctx, w, ins, addr[w.exec_mask], size)
    return addr


def _check_lds(ctx, w, ins, addr: np.ndarray, size: int) -> None:
    limit = len(w.lds)
    if len(addr) and (addr.min() < 0 or addr.max() + size > limit):
        raise MemoryFault(f"{ins.addr:#x} {ins.text}: LDS access of {size} bytes at {int(addr.max())} "
                          f"is outside the workgroup's {limit}-byte allocation")


LDS_WIDTH = {"b32": 1, "b64": 2, "b128": 4}


@define([f"ds_read_{k}" for k in LDS_WIDTH], LDS, "PCODE {NAME}")
def ds_read(w, ins, ctx):
    dwords = LDS_WIDTH[ins.name.split("_")[-1]]
    addr, mask, dst = _lds_addresses(w, ins, ctx, 4 * dwords), w.exec_mask.copy(), ins.operands[0]

    def complete():
        rows = w.lds[np.where(mask, addr, 0)[:, None] + np.arange(4 * dwords)]
        _write_regs(w, dst, _rows_to_regs(rows, dwords), mask)
    ctx.issue(w, ins, complete)


@define([f"ds_write_{k}" for k in LDS_WIDTH], LDS, "PCODE {NAME}")
def ds_write(w, ins, ctx):
    dwords = LDS_WIDTH[ins.name.split("_")[-1]]
    addr, mask = _lds_addresses(w, ins, ctx, 4 * dwords), w.exec_mask.copy()
    rows = _regs_to_rows(w, ins.operands[1], dwords)[mask]
    addr = addr[mask]

    def complete():
        w.lds[addr[:, None] + np.arange(4 * dwords)] = rows
    ctx.issue(w, ins, complete)


TR_B8_GROUP = 16  # lanes that exchange data in one transposing read
TR_B8_ELEMENTS = 8  # bytes per lane


@define("ds_read_b64_tr_b8", LDS, "gfx950.md (check): per 16 lanes, lane d byte j <- lane 2j + d/8 byte d%8")
def ds_read_b64_tr_b8(w, ins, ctx):
    addr, mask, dst = _lds_addresses(w, ins, ctx, TR_B8_ELEMENTS), w.exec_mask.copy(), ins.operands[0]
    lane = np.arange(LANES)
    d = lane % TR_B8_GROUP
    j = np.arange(TR_B8_ELEMENTS)
    src_lane = (lane - d)[:, None] + 2 * j[None, :] + (d // 8)[:, None]
    src_byte = np.broadcast_to((d % 8)[:, None], src_lane.shape)

    def complete():
        rows = w.lds[np.where(mask, addr, 0)[:, None] + np.arange(TR_B8_ELEMENTS)]
        out = rows[src_lane, src_byte].astype(np.uint8)
        _write_regs(w, dst, _rows_to_regs(out, 2), mask)
    ctx.issue(w, ins, complete)


@define("ds_bpermute_b32", LDS, "PCODE {NAME}")
def ds_bpermute_b32(w, ins, ctx):
    dst, addr_op, data_op = ins.operands
    mask = w.exec_mask.copy()
    src_lane = ((w.vread(addr_op).astype(np.int64) + ins.mods.get("offset", 0)) // 4) % LANES
    data = w.vread(data_op)
    result = np.where(mask[src_lane], data[src_lane], 0).astype(np.uint32)

    def complete():
        w.vwrite(dst, result, mask=mask)
    ctx.issue(w, ins, complete)


def _check_global(ctx, ins, addrs: np.ndarray, size: int) -> None:
    """Fault at issue, naming the instruction, rather than when the access completes."""
    try:
        ctx.memory.check(addrs, size)
    except MemoryFault as fault:
        raise MemoryFault(f"{ins.addr:#x} {ins.text}: {fault}") from None


# --- MUBUF --------------------------------------------------------------------------------------------------------
def _buffer_addresses(w, ins, vaddr, rsrc_op, soffset_op, size: int):
    """(global addresses, in-range mask) per lane for a MUBUF access of `size` bytes.

    ISA guide: offset = (offen ? VGPR offset : 0) + inst_offset, index = (idxen ? VGPR index : 0) (+ lane id when
    the V# sets add_tid); address = base + soffset + offset + stride * index. The range check uses offset
    (and the index for structured buffers), not soffset: raw buffers keep bytes with offset + size <= num_records.
    """
    rsrc = BufferResource.from_dwords([w.s[rsrc_op.index + i] for i in range(4)])
    offset = np.full(LANES, ins.mods.get("offset", 0), dtype=np.int64)
    index = np.zeros(LANES, dtype=np.int64)
    reg = 0
    if ins.mods.get("idxen"):
        index += w.vread(vaddr, reg).astype(np.int64)
        reg += 1
    if ins.mods.get("offen"):
        offset += w.vread(vaddr, reg).astype(np.int64)
    if rsrc.add_tid:
        index += np.arange(LANES)
    if rsrc.stride == 0 and not ins.mods.get("idxen") and not rsrc.add_tid:
        in_range = offset + size <= rsrc.num_records
    else:
        in_range = (index < rsrc.num_records) & (offset + size <= rsrc.stride)
    addr = rsrc.base + w.sread(soffset_op) + offset + rsrc.stride * index
    return addr, in_range


@define([f"buffer_load_{k}" for k in ("dword", "dwordx2", "dwordx4")], VMEM_LOAD,
        "PCODE {NAME} + ISA guide (buffer addressing, out-of-range lanes read 0; "
        "lds: M0 + offset + lane * bytes per lane, check)")
def buffer_load(w, ins, ctx):
    dwords = DWORDS[ins.name.split("_")[-1]]
    to_lds = bool(ins.mods.get("lds"))
    ops = ins.operands if to_lds else ins.operands[1:]
    vaddr, rsrc, soffset = ops
    addr, in_range = _buffer_addresses(w, ins, vaddr, rsrc, soffset, 4 * dwords)
    mask = w.exec_mask.copy()
    live = mask & in_range
    _check_global(ctx, ins, addr[live], 4 * dwords)
    if to_lds:
        size = 4 * dwords
        lds_addr = (w.s[M0] & LDS_DMA_M0_MASK) + ins.mods.get("offset", 0) + size * np.arange(LANES)
        _check_lds(ctx, w, ins, lds_addr[mask], size)

        def complete():
            rows = np.zeros((LANES, size), dtype=np.uint8)
            rows[live] = ctx.memory.gather(addr[live], size)
            w.lds[lds_addr[mask][:, None] + np.arange(size)] = rows[mask]
    else:
        dst = ins.operands[0]

        def complete():
            rows = np.zeros((LANES, 4 * dwords), dtype=np.uint8)
            rows[live] = ctx.memory.gather(addr[live], 4 * dwords)
            _write_regs(w, dst, _rows_to_regs(rows, dwords), mask)
    ctx.issue(w, ins, complete)


STORE_BYTES = {"dword": 4, "dwordx2": 8, "dwordx4": 16, "short": STORE_SHORT_BYTES}


@define([f"buffer_store_{k}" for k in STORE_BYTES], VMEM_STORE,
        "PCODE {NAME} + ISA guide (buffer addressing, out-of-range lanes dropped)")
def buffer_store(w, ins, ctx):
    size = STORE_BYTES[ins.name.split("_")[-1]]
    data_op, vaddr, rsrc, soffset = ins.operands
    addr, in_range = _buffer_addresses(w, ins, vaddr, rsrc, soffset, size)
    live = w.exec_mask & in_range
    rows = _regs_to_rows(w, data_op, max(size // 4, 1))[:, :size][live]
    addr = addr[live]
    _check_global(ctx, ins, addr, size)
    ctx.issue(w, ins, lambda: ctx.memory.scatter(addr, rows))


# --- GLOBAL -------------------------------------------------------------------------------------------------------
def _global_addresses(w, ins, vaddr, saddr) -> np.ndarray:
    """PCODE CalcGlobalAddr: saddr ? SGPR pair + zero-extended VGPR : VGPR pair; plus the signed offset."""
    offset = ins.mods.get("offset", 0)
    if saddr.kind == "off":
        lo, hi = w.vread(vaddr, 0).astype(np.int64), w.vread(vaddr, 1).astype(np.int64)
        return (hi << 32 | lo) + offset
    if saddr.kind != "s":
        raise SimError(f"{ins.addr:#x}: global saddr must be an SGPR pair or off")
    return w.sread(saddr, 64) + w.vread(vaddr).astype(np.int64) + offset


@define([f"global_load_{k}" for k in ("dword", "dwordx2", "dwordx4")], VMEM_LOAD, "PCODE {NAME}")
def global_load(w, ins, ctx):
    dwords = DWORDS[ins.name.split("_")[-1]]
    dst, vaddr, saddr = ins.operands
    mask = w.exec_mask.copy()
    addr = _global_addresses(w, ins, vaddr, saddr)
    _check_global(ctx, ins, addr[mask], 4 * dwords)

    def complete():
        rows = np.zeros((LANES, 4 * dwords), dtype=np.uint8)
        rows[mask] = ctx.memory.gather(addr[mask], 4 * dwords)
        _write_regs(w, dst, _rows_to_regs(rows, dwords), mask)
    ctx.issue(w, ins, complete)


@define([f"global_store_{k}" for k in STORE_BYTES], VMEM_STORE, "PCODE {NAME}")
def global_store(w, ins, ctx):
    size = STORE_BYTES[ins.name.split("_")[-1]]
    vaddr, data_op, saddr = ins.operands
    mask = w.exec_mask.copy()
    addr = _global_addresses(w, ins, vaddr, saddr)[mask]
    rows = _regs_to_rows(w, data_op, max(size // 4, 1))[:, :size][mask]
    _check_global(ctx, ins, addr, size)
    ctx.issue(w, ins, lambda: ctx.memory.scatter(addr, rows))
