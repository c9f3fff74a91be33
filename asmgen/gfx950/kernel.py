"""Generator of the gfx950 causal FP8 forward attention kernels (one assembly text per kernel variant).

Work split (see docs/gfx950.md for the full design and its reasoning):
  * a persistent grid (PERSISTENT_GRID workgroups on an MI355X; the kernel reads the grid size from the dispatch
    packet) walks the job table [batch, head, tile_lo, tile_hi] with stride grid; each job is two 256-row query
    tiles (tile_hi first), so every job carries the same causal work;
  * 8 waves of 32 query rows each; waves w and w+4 share a SIMD and run half a key tile apart (ping-pong): group B
    (waves 4-7) passes one extra barrier before the key loop and group A one after it, so while one group issues
    the QK matrix instructions the other runs its softmax and PV;
  * K and V key tiles of TILE_N keys stream through RING_SLOTS-slot LDS rings filled by direct-to-LDS buffer loads,
    PREFETCH tiles ahead;
  * scores are computed transposed, S^T = K Q^T (K is the A operand), so lane l holds query l%32 and half of the
    keys; P then is already the B operand of O^T = V^T P^T, and each lane's accumulators belong to its own query;
  * V^T (the A operand of PV, the same for every wave) is built once per tile: each wave transposes an eighth of
    it into a 2-slot V^T ring in LDS, from which all waves read their operands.
Numerics follow zyfa.numerics with key_tile = TILE_N = scale block: the tile's maximum is the block maximum.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from .emitter import Emitter
from .registers import RegisterTable

TILE_M = 256  # query rows per workgroup tile
WAVES = 8
WAVE_SIZE = 64
ROWS_PER_WAVE = TILE_M // WAVES  # 32: the N dimension of one 32x32 MFMA
TILE_N = 64  # keys per key tile = one power-of-two scaling block
SCALE_BLOCK = TILE_N  # the key tile is one scaling block, so its maximum is the block maximum
RING_SLOTS = 4
PREFETCH = RING_SLOTS - 1  # key tiles in flight ahead of the one being computed
GROUP_B_FIRST_WAVE = 4  # waves 4-7 run half a tile behind waves 0-3
PERSISTENT_GRID = 256  # one workgroup per CU of an MI355X; the job table is chiplet-ordered for this grid
DISPATCH_GRID_SIZE_X = 12  # byte offset of grid_size_x (work-items) in the HSA kernel dispatch packet
MFMA = "v_mfma_f32_32x32x64_f8f6f4"
MFMA_K = 64  # contraction depth of one fp8 MFMA
MFMA_ROWS = 32
MFMA_ACC_REGS = 16  # 32x32 FP32 outputs per lane
MFMA_OPERAND_REGS = 8  # 64 fp8 per lane
LDS_LIMIT = 163840
TAU = 0.125  # lazy rescaling threshold (FP8), base-2 units
P_SHIFT = 8  # P is written 2^8 larger before its e4m3 rounding (the contract's P offset); it cancels in O / l
LEAN_CODE_OF_ONE = 56  # e4m3 bit pattern of 1.0; the code grows by 8 per doubling
LEAN_CODE_PER_DOUBLING = 8
LEAN_CODE_MAX = LEAN_CODE_OF_ONE + LEAN_CODE_PER_DOUBLING * P_SHIFT  # 120 = e4m3 2^8: the code of y = 0
FP8_ONES = 0x38383838  # four e4m3 1.0 bytes: the A operand that turns the PV MFMA into a row sum
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
NEG_INF = 0xFF800000
# V# word 3 for gfx950 raw buffers: DATA_FORMAT = 32 (bits 18:15 = 4) so dword accesses are valid; all
# destination selects and the number format zero, no swizzle, no index stride, no add_tid.
BUFFER_WORD3 = 0x00020000
BUFFER_NUM_RECORDS = 0xFFFFFFFF  # offsets are bounded by the shapes; no clamping wanted
BYTES_BF16 = 2
BYTES_F32 = 4
JOB_BYTES = 16
# v_perm_b32 selectors of a 4x4 byte transpose (bytes 0-3 pick from the second source, 4-7 from the first)
PERM_INTERLEAVE_LO = 0x05010400  # (a.b0, b.b0, a.b1, b.b1)
PERM_INTERLEAVE_HI = 0x07030602  # (a.b2, b.b2, a.b3, b.b3)
PERM_HALVES_LO = 0x05040100  # (a.b0, a.b1, b.b0, b.b1)
PERM_HALVES_HI = 0x07060302  # (a.b2, a.b3, b.b2, b.b3)
VT_SLOTS = 2  # V^T operand slots in LDS: tile n is read while tile n+1 is written
KEY_LOOP_UNROLL = RING_SLOTS  # key tiles per pass of the loop: every slot index is then a constant
DS_OFFSET_LIMIT = 65535  # the 16-bit offset field of LDS instructions
KEY_GROUP = 4  # keys per 4x4 byte transpose = V^T operand bytes per register
MASK_LAG = 2  # causal mask: compares issued ahead of their selects (the VALU SGPR write -> VALU read distance)
MAGIC_DIV3 = (43691, 17)  # floor(x / 3) == (x * 43691) >> 17 for x < 2^15

ARGS = [("q", "ptr"), ("k", "ptr"), ("v", "ptr"), ("out", "ptr"), ("lse", "ptr"), ("q_descale", "ptr"),
        ("k_descale", "ptr"), ("v_descale", "ptr"), ("jobs", "ptr"), ("num_jobs", "i32"), ("seqlen", "i32"),
        ("heads", "i32"), ("heads_k", "i32"), ("softmax_scale", "f32")] + [
    (f"{t}_stride_{a}", "i32") for t in ("q", "k", "v", "out") for a in ("b", "s", "h")]
ARG_SIZE = {"ptr": 8, "i32": 4, "u32": 4, "i64": 8, "f32": 4}
FAULTS = frozenset({"drop_waitcnt", "drop_barrier", "bad_lds_offset"})


def arg_offsets() -> dict[str, int]:
    """Byte offset of each kernel argument, packed with natural alignment."""
    offsets, at = {}, 0
    for name, kind in ARGS:
        size = ARG_SIZE[kind]
        at = -(-at // size) * size
        offsets[name] = at
        at += size
    return offsets


def kernarg_used_bytes() -> int:
    name, kind = ARGS[-1]
    return arg_offsets()[name] + ARG_SIZE[kind]


def kernarg_bytes() -> int:
    """Kernel argument segment size: the arguments rounded up to the 8-byte segment alignment."""
    return -(-kernarg_used_bytes() // 8) * 8


def f32_bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def f32_value(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits))[0]


@dataclass(frozen=True)
class Variant:
    name: str
    d_qk: int
    d_v: int
    p_mode: str  # "lean" or "exact"
    p_mode_default: bool  # what a call that names no p_mode gets at these head dims

    @property
    def symbol(self) -> str:
        return f"zyfa_gfx950_{self.name}"

    @property
    def k_tile_bytes(self) -> int:
        return TILE_N * self.d_qk

    @property
    def v_tile_bytes(self) -> int:
        return TILE_N * self.d_v

    @property
    def v_ring_base(self) -> int:
        return RING_SLOTS * self.k_tile_bytes

    @property
    def vt_ring_base(self) -> int:
        return self.v_ring_base + RING_SLOTS * self.v_tile_bytes

    @property
    def vt_group_bytes(self) -> int:
        """Bytes of one d_v group's V^T operands in a V^T slot: 64 lanes x 8 registers."""
        return WAVE_SIZE * MFMA_OPERAND_REGS * 4

    @property
    def vt_slot_bytes(self) -> int:
        return self.d_v // MFMA_ROWS * self.vt_group_bytes

    @property
    def lds_bytes(self) -> int:
        return RING_SLOTS * (self.k_tile_bytes + self.v_tile_bytes) + VT_SLOTS * self.vt_slot_bytes

    @property
    def qk_chunks(self) -> int:
        return self.d_qk // MFMA_K


def ring_chunk_bytes(row_bytes: int) -> int:
    """Bytes per lane of the direct-to-LDS loads of one key tile: 16 when each wave's share is a whole number of
    64-lane x 16-byte loads, else 4 (the only other sizes gfx950 accepts are 1, 2 and 12)."""
    share = TILE_N * row_bytes // WAVES
    return 16 if share % (WAVE_SIZE * 16) == 0 else 4


def ring_loads(row_bytes: int) -> int:
    return TILE_N * row_bytes // WAVES // (WAVE_SIZE * ring_chunk_bytes(row_bytes))


def key_of_slot(half: int, byte: int) -> int:
    """Key (within a 64-key block) whose score sits in P's byte `byte` of a lane in half `half` (lanes 32-63 = 1).

    P byte 16*j + r comes from register r of the S^T accumulator of key half j, which holds key
    32*j + 8*(r//4) + 4*half + r%4 (the 32x32 MFMA output layout). V^T is loaded to match slot for slot."""
    j, r = divmod(byte, 16)
    return 32 * j + 8 * (r // 4) + 4 * half + r % 4


def v_share_keys(wave: int) -> set[int]:
    """Keys of a V tile that `wave` reads for its eighth of V^T (operand register g = wave, both half-waves)."""
    return {key_of_slot(half, KEY_GROUP * wave + kk) for half in range(2) for kk in range(KEY_GROUP)}


def v_loaded_keys(wave: int, d_v: int) -> set[int]:
    """Keys of a V tile that `wave`'s direct-to-LDS loads bring in.

    The V^T share of tile n+1 is built right after barrier B2_n. With the two groups half an iteration apart, the
    loads known to have landed then are those of the waves of the same group, so each wave transposes exactly the
    rows it loaded itself (checked when generating)."""
    share = TILE_N * d_v // WAVES
    return {(wave * share + o) // d_v for o in range(share)}


class KernelGen:
    def __init__(self, variant: Variant, faults: frozenset[str]) -> None:
        unknown = set(faults) - FAULTS
        if unknown:
            raise ValueError(f"faults: unknown {sorted(unknown)}; known are {sorted(FAULTS)}")
        if variant.lds_bytes > LDS_LIMIT:
            raise ValueError(f"{variant.name}: LDS {variant.lds_bytes} exceeds {LDS_LIMIT}")
        self.k = variant
        self.faults = faults
        self.e = Emitter()
        self.r = RegisterTable()
        self.karg = arg_offsets()
        self.loads_k = ring_loads(variant.d_qk)
        self.loads_v = ring_loads(variant.d_v)
        self.loads_per_tile = self.loads_k + self.loads_v
        self.sfx = ""  # label suffix of the key-loop copy being emitted
        for wave in range(WAVES):
            if v_share_keys(wave) != v_loaded_keys(wave, variant.d_v):
                raise ValueError(f"{variant.name}: wave {wave} would transpose V rows it did not load itself")
        self._allocate()

    # ---------------------------------------------------------------------------------------------- registers
    def _allocate(self) -> None:
        r, k = self.r, self.k
        self.s_dispatch = r.fixed("dispatch_ptr", "s", 0, 2, "HSA dispatch packet pointer (hardware)")
        self.s_kernarg = r.fixed("kernarg_ptr", "s", 2, 2, "kernel argument segment pointer (hardware)")
        self.s_wg = r.fixed("workgroup_id", "s", 4, 1, "workgroup id x (hardware)")
        self.s_args = r.alloc("args", "s", 36, "kernel arguments, dword k of the segment at args[k]", align=4)
        self.srd = {t: r.alloc(f"srd_{t}", "s", 4, f"buffer resource of {t} at this job's batch/head", align=4)
                    for t in ("q", "k", "v", "out", "lse")}
        self.s_job_row = r.alloc("job_row", "s", 4, "job: batch, head, tile_lo, tile_hi", align=4)
        self.s_pair = r.alloc("tmp64", "s", 2, "64-bit temporary / compare mask", align=2)
        self.s_mask = r.alloc("mask64", "s", 2, "causal mask: a second compare result in flight", align=2)
        self.s_perm = r.alloc("perm_sel", "s", 4, "v_perm_b32 selectors of the V transpose")
        names = ["job", "grid", "wave", "group_b", "grp", "hk", "acc", "tile", "last_tile", "row0", "key_tile",
                 "key0", "active", "scaled", "soff", "share_k", "share_v", "tmp", "tmp2", "qd", "kd", "vd"]
        purposes = ["job index of this workgroup", "workgroups in the grid (the job stride)", "wave id 0-7",
                    "1 for waves 4-7 (ping-pong group B)",
                    "query heads per KV head", "KV head of the job", "division accumulator",
                    "query tile being computed", "last key tile of this query tile", "first query row of this wave",
                    "key tile index n", "first key of tile n", "1 if this wave has unmasked keys in tile n",
                    "nonzero if some lane of tile n has e != 0 (block-scaled path)",
                    "buffer soffset", "this wave's first byte in a K ring slot",
                    "this wave's first byte in a V ring slot, plus the V ring base", "scalar temporary",
                    "scalar temporary",
                    "q descale", "k descale", "v descale"]
        self.s = {n: r.alloc(f"s_{n}", "s", 1, p) for n, p in zip(names, purposes, strict=True)}

        self.v_tid = r.fixed("workitem_id", "v", 0, 1, "workitem id x (hardware)")
        vnames = ["lane", "lane32", "half", "q_off", "k_read", "v_read", "vt_write", "vt_lane",
                  "mask_base", "thr",
                  "o_off", "lse_off", "neg_inf", "m", "m_tau", "mt", "swap", "ei", "new_m", "tmp"]
        vpurposes = ["lane 0-63", "lane % 32: the query column of this lane", "lane / 32",
                     "Q load offset of this lane", "K LDS read address in slot 0 (slots: + constant offsets)",
                     "V LDS read address of this wave's key group in V slot 0",
                     "V^T LDS write address in V^T slot 0", "V^T LDS read address in V^T slot 0 (base + lane * 32)",
                     "lane%32 - 4*half (causal mask)",
                     "mask threshold of this tile", "output store offset", "lse store offset", "-inf",
                     "reference maximum m", "m + tau (set with m)", "tile maximum", "partner half's maximum",
                     "-e as integer", "new m", "temporary"]
        self.v = {n: r.alloc(f"v_{n}", "v", 1, p) for n, p in zip(vnames, vpurposes, strict=True)}
        # Per-lane scalars that packed FP32 math (v_pk_*) applies to two elements, in even-aligned pairs: c is held
        # twice; the others sit in the low register (or, for the lean constants, in both) and op_sel / op_sel_hi pick
        # the register that feeds each half.
        pairs = {"c": "c = scale*log2(e)*qd*kd, twice", "neg_m": "-m (low register)",
                 "e": "block exponent e (low register)", "fac": "2^-e (low register)",
                 "alpha": "lazy rescale factor 2^(m_old - m) (low register)",
                 "scale": "v_descale / l (epilogue), twice"}
        if k.p_mode == "lean":
            pairs["lean_w"] = "lean P: (8, 120): w = 8y + 120, rounded to the code by v_cvt_pk_u8_f32"
        else:
            pairs["p_offset"] = "exact P: 2^8, the P offset (low register)"
        self.pair = {n: r.alloc(f"v_{n}2", "v", 2, p, align=2) for n, p in pairs.items()}
        if k.p_mode == "lean":
            self.pair["woff"] = r.alias("v_woff2", self.pair["alpha"], 0, 2,
                                        "lean P where every e >= 0: 8e + 120 (after the lazy rescale)")
        self.v_kload = r.alloc("k_ring_off", "v", self.loads_k, "global offsets of this lane's K ring loads")
        self.v_vload = r.alloc("v_ring_off", "v", self.loads_v, "global offsets of this lane's V ring loads")
        self.q = r.alloc("q_op", "v", MFMA_OPERAND_REGS * k.qk_chunks, "Q^T B operands, one per 64 of d_qk",
                         align=2)
        self.kop = r.alloc("k_op", "v", 2 * MFMA_OPERAND_REGS * k.qk_chunks,
                           "K A operands: key half j, d chunk c at (j*chunks + c)*8", align=2)
        self.vraw = r.alias("v_raw", self.kop, 0, KEY_GROUP,
                            "V bytes of this wave's 4 keys: 4 d_v columns of one key per register (after QK)")
        self.sacc = r.alloc("scores", "v", 2 * MFMA_ACC_REGS, "S^T accumulators of key halves 0 and 1 -> x -> y",
                            align=2)
        self.part = r.alias("pv_part", self.sacc, 0, 2 * MFMA_ACC_REGS,
                            "PV block products, double-buffered (after P is built)")
        self.p = r.alloc("p", "v", MFMA_OPERAND_REGS, "P8^T: the B operand of the PV MFMAs", align=2)
        va_regs, va_purpose = 4 * MFMA_OPERAND_REGS, "V^T A operands of d_v groups 0-3"
        if self.kop.count >= self.vraw.count + va_regs:  # wide heads: V^T fits where K was (after QK)
            self.va = r.alias("v_op", self.kop, self.vraw.count, va_regs, va_purpose)
        else:
            self.va = r.alloc("v_op", "v", va_regs, va_purpose, align=2)
        self.ones = r.alloc("ones", "v", MFMA_OPERAND_REGS, "e4m3 ones: A operand of the row-sum MFMA", align=2)
        self.tr = r.alloc("transpose", "v", 4, "4x4 byte transpose temporaries")
        self.o = r.alloc("o_acc", "v", 4 * MFMA_ACC_REGS, "O^T accumulators of d_v groups 0-3", align=2)
        self.out_pk = r.alias("out_bf16", self.sacc, 0, 2 * MFMA_ACC_REGS, "packed BF16 output (epilogue)")
        self.lacc = r.alloc("l_acc", "v", MFMA_ACC_REGS, "row sum l in register 0: the row-sum MFMA's C/D", align=2)
        self.l = self.lacc[0]

    def arg(self, name: str) -> str:
        return self.s_args[self.karg[name] // 4]

    def arg_pair(self, name: str) -> str:
        return self.s_args.span(self.karg[name] // 4, 2)

    # ---------------------------------------------------------------------------------------------- sections
    def generate(self) -> str:
        self.prologue()
        self.job_loop()
        return self.wrap(self.e.text())

    def prologue(self) -> None:
        e, s, v = self.e, self.s, self.v
        e.section("prologue: arguments, lane constants, buffer resources")
        at, used = 0, -(-kernarg_used_bytes() // 4)
        while at < used:  # widest loads first, never reading past the last argument
            width = max(w for w in (1, 2, 4, 8) if w <= used - at)
            e.op(f"s_load_dword{'' if width == 1 else f'x{width}'}", self.s_args.span(at, width),
                 self.s_kernarg.all, hex(at * 4))
            at += width
        e.op("s_load_dword", s["grid"], self.s_dispatch.all, hex(DISPATCH_GRID_SIZE_X),
             note="grid size in work-items, from the dispatch packet")
        e.op("v_and_b32", v["lane"], WAVE_SIZE - 1, self.v_tid)
        e.op("v_and_b32", v["lane32"], ROWS_PER_WAVE - 1, self.v_tid)
        e.op("v_bfe_u32", v["half"], self.v_tid, ROWS_PER_WAVE.bit_length() - 1, 1, note="lane / 32 within the wave")
        e.op("v_lshrrev_b32", v["tmp"], WAVE_SIZE.bit_length() - 1, self.v_tid)
        e.op("v_readfirstlane_b32", s["wave"], v["tmp"])
        e.op("s_waitcnt", "lgkmcnt(0)")
        e.op("s_lshr_b32", s["grid"], s["grid"], (WAVES * WAVE_SIZE).bit_length() - 1, note="-> workgroups")
        e.op("s_cmp_ge_u32", s["wave"], GROUP_B_FIRST_WAVE)
        e.op("s_cselect_b32", s["group_b"], 1, 0)
        self._lane_constants()
        self._ring_offsets()
        for stride in ("k_stride_s", "v_stride_s"):
            e.op("s_lshl_b32", self.arg(stride), self.arg(stride), TILE_N.bit_length() - 1,
                 note=f"{stride} from here on: the bytes of one key tile")
        e.comment("query heads per KV head (heads % heads_k == 0): count up in steps of heads_k")
        e.op("s_mov_b32", s["grp"], 0)
        e.op("s_mov_b32", s["acc"], 0)
        e.label(".Lgroup_count")
        e.op("s_add_u32", s["acc"], s["acc"], self.arg("heads_k"))
        e.op("s_add_u32", s["grp"], s["grp"], 1)
        e.op("s_cmp_lt_u32", s["acc"], self.arg("heads"))
        e.op("s_cbranch_scc1", ".Lgroup_count")
        for word, val in ((2, BUFFER_NUM_RECORDS), (3, BUFFER_WORD3)):
            for t in self.srd.values():
                e.op("s_mov_b32", t[word], hex(val))
        for i, sel in enumerate((PERM_INTERLEAVE_LO, PERM_INTERLEAVE_HI, PERM_HALVES_LO, PERM_HALVES_HI)):
            e.op("s_mov_b32", self.s_perm[i], hex(sel))
        e.op("v_mov_b32", v["neg_inf"], hex(NEG_INF))
        constants = {"lean_w": (LEAN_CODE_PER_DOUBLING, LEAN_CODE_MAX), "p_offset": (2.0**P_SHIFT,)}
        for name, values in constants.items():
            for i, value in enumerate(values if name in self.pair else ()):
                e.op("v_mov_b32", self.pair[name][i], hex(f32_bits(float(value))))
        for i in range(self.ones.count):
            e.op("v_mov_b32", self.ones[i], hex(FP8_ONES))
        e.op("s_mov_b32", s["job"], self.s_wg)

    def _lane_constants(self) -> None:
        e, v, k = self.e, self.v, self.k
        e.comment("Q^T B operand: lane l reads query row l%32, bytes 16*half.. and 32+16*half.. of each 64 of d")
        e.op("v_mul_lo_u32", v["q_off"], v["lane32"], self.arg("q_stride_s"))
        e.op("v_lshl_add_u32", v["q_off"], v["half"], 4, v["q_off"])
        e.comment("K A operand: lane l reads key row l%32 of the key half, same byte split as Q")
        e.op("v_mul_u32_u24", v["k_read"], k.d_qk, v["lane32"])
        e.op("v_lshl_add_u32", v["k_read"], v["half"], 4, v["k_read"])
        if "bad_lds_offset" in self.faults:
            e.op("v_add_u32", v["k_read"], k.d_qk, v["k_read"], note="FAULT: K read one row off")
        e.comment("V^T share of wave w: the 4 keys of operand register g = w; lane l reads d_v columns")
        e.comment("4*(l%32)..+3 of key 32*(w/4) + 8*(w%4) + 4*half + kk, kk = 0..3")
        s = self.s
        e.op("s_lshr_b32", s["tmp"], s["wave"], 2)
        e.op("s_mul_i32", s["tmp"], s["tmp"], key_of_slot(0, 4 * KEY_GROUP))
        e.op("s_and_b32", s["tmp2"], s["wave"], 3)
        e.op("s_mul_i32", s["tmp2"], s["tmp2"], key_of_slot(0, KEY_GROUP))
        e.op("s_add_u32", s["tmp"], s["tmp"], s["tmp2"])
        e.op("s_mul_i32", s["tmp"], s["tmp"], k.d_v)
        e.op("s_add_u32", s["tmp"], s["tmp"], k.v_ring_base)
        e.op("v_mul_u32_u24", v["v_read"], KEY_GROUP * k.d_v, v["half"])
        e.op("v_lshl_add_u32", v["v_read"], v["lane32"], 2, v["v_read"])
        e.op("v_add_u32", v["v_read"], s["tmp"], v["v_read"])
        e.comment("V^T slot layout: [d_v group i][lane][register g], so a lane reads its 8 registers as 32 bytes")
        e.op("v_lshlrev_b32", v["vt_lane"], (MFMA_OPERAND_REGS * 4).bit_length() - 1, v["lane"])
        e.op("v_add_u32", v["vt_lane"], k.vt_ring_base, v["vt_lane"], note="+ V^T ring base")
        e.op("s_lshl_b32", s["tmp"], s["wave"], 2)
        e.op("v_add_u32", v["vt_write"], s["tmp"], v["vt_lane"])
        e.op("v_lshlrev_b32", v["tmp"], 2, v["half"])
        e.op("v_sub_u32", v["mask_base"], v["lane32"], v["tmp"], note="query - key offset of slot 0 of this lane")
        e.comment("output: lane l stores query row l%32, d_v columns 16*half + 32*(r/4) + 4*(r%4) .. +3")
        e.op("v_mul_lo_u32", v["o_off"], v["lane32"], self.arg("out_stride_s"))
        e.op("v_lshlrev_b32", v["o_off"], 1, v["o_off"])
        e.op("v_lshl_add_u32", v["o_off"], v["half"], 5, v["o_off"])
        e.op("v_lshlrev_b32", v["lse_off"], 2, v["lane32"])

    def _ring_offsets(self) -> None:
        """Global byte offset (relative to the tile's first key) of each direct-to-LDS load of this lane.

        The loads of one tile deposit it packed, row after row, in its slot: wave w fills bytes
        [w*share, (w+1)*share), its load i lanes' chunks in order, so lane chunk o holds key o // d, byte o % d."""
        e, v, s = self.e, self.v, self.s
        for regs, row_bytes, stride in ((self.v_kload, self.k.d_qk, "k_stride_s"),
                                        (self.v_vload, self.k.d_v, "v_stride_s")):
            chunk = ring_chunk_bytes(row_bytes)
            share = TILE_N * row_bytes // WAVES
            e.comment(f"ring loads of {row_bytes}-byte rows: {regs.count} x {chunk} bytes per lane")
            e.op("s_mul_i32", s["tmp"], s["wave"], share)
            if regs is self.v_kload:
                e.op("s_mov_b32", s["share_k"], s["tmp"], note="this wave's bytes of a K slot start here")
            else:
                e.op("s_add_u32", s["share_v"], s["tmp"], self.k.v_ring_base,
                     note="this wave's bytes of a V slot start here (+ V ring base)")
            for i in range(regs.count):
                o, key, col = v["tmp"], v["ei"], v["new_m"]
                e.op("v_mul_u32_u24", o, chunk, v["lane"])
                e.op("v_add_u32", o, s["tmp"], o)
                if i:
                    e.op("v_add_u32", o, i * WAVE_SIZE * chunk, o)
                self._divmod_const(o, row_bytes, key, col)
                e.op("v_mul_lo_u32", key, key, self.arg(stride))
                e.op("v_add_u32", regs[i], key, col)

    def _divmod_const(self, o: str, d: int, quo: str, rem: str) -> None:
        e = self.e
        if d & (d - 1) == 0:
            e.op("v_lshrrev_b32", quo, d.bit_length() - 1, o)
        elif d % 3 == 0 and (d // 3) & (d // 3 - 1) == 0:
            mul, shift = MAGIC_DIV3
            assert all((x * mul) >> shift == x // 3 for x in range(TILE_N * d // (d // 3) + 1))
            e.op("v_lshrrev_b32", quo, (d // 3).bit_length() - 1, o, note=f"o // {d} = (o >> log2({d // 3})) // 3")
            e.op("v_mul_u32_u24", quo, mul, quo)
            e.op("v_lshrrev_b32", quo, shift, quo)
        else:
            raise ValueError(f"row of {d} bytes: no division by a constant implemented")
        e.op("v_mul_u32_u24", rem, d, quo)
        e.op("v_sub_u32", rem, o, rem)

    def job_loop(self) -> None:
        e, s = self.e, self.s
        jb, jh, jlo, jhi = (self.s_job_row[i] for i in range(4))
        e.section("job loop: one job = (batch, head, tile_lo, tile_hi) from the chiplet-ordered table")
        e.label(".Ljob_loop")
        e.op("s_cmp_ge_u32", s["job"], self.arg("num_jobs"))
        e.op("s_cbranch_scc1", ".Ldone")
        e.op("s_lshl_b32", s["tmp"], s["job"], JOB_BYTES.bit_length() - 1)
        e.op("s_load_dwordx4", self.s_job_row.all, self.arg_pair("jobs"), s["tmp"])
        e.op("s_waitcnt", "lgkmcnt(0)")
        e.comment("KV head = head // (heads / heads_k)")
        e.op("s_mov_b32", s["hk"], 0)
        e.op("s_mov_b32", s["acc"], s["grp"])
        e.label(".Lkv_head")
        e.op("s_cmp_gt_u32", s["acc"], jh)
        e.op("s_cbranch_scc1", ".Lkv_head_done")
        e.op("s_add_u32", s["acc"], s["acc"], s["grp"])
        e.op("s_add_u32", s["hk"], s["hk"], 1)
        e.op("s_branch", ".Lkv_head")
        e.label(".Lkv_head_done")
        self._set_base("q", "q", jb, jh, 1)
        self._set_base("k", "k", jb, s["hk"], 1)
        self._set_base("v", "v", jb, s["hk"], 1)
        self._set_base("out", "out", jb, jh, BYTES_BF16)
        e.comment("lse is (batch, heads, seqlen) float32: base + 4 * (batch*heads + head) * seqlen")
        e.op("s_mul_i32", s["tmp"], jb, self.arg("heads"))
        e.op("s_add_u32", s["tmp"], s["tmp"], jh)
        self._add_product(self.srd["lse"], self.arg_pair("lse"), [(s["tmp"], self.arg("seqlen"))], BYTES_F32)
        e.comment("descales are float32 (batch, heads_k): one of each per job")
        e.op("s_mul_i32", s["tmp"], jb, self.arg("heads_k"))
        e.op("s_add_u32", s["tmp"], s["tmp"], s["hk"])
        e.op("s_lshl_b32", s["tmp"], s["tmp"], 2)
        for name in ("qd", "kd", "vd"):
            e.op("s_load_dword", s[name], self.arg_pair(f"{name[0]}_descale"), s["tmp"])
        e.op("s_waitcnt", "lgkmcnt(0)")
        e.comment("c = ((softmax_scale * log2(e)) * q_descale) * k_descale in FP32, the model's order; the first")
        e.comment("product is rounded once: log2(e) = hi + lo in two floats, the error of scale*hi recovered by an FMA")
        v = self.v
        c, scale = self.pair["c"], self.arg("softmax_scale")
        e.op("v_mov_b32", v["tmp"], hex(f32_bits(LOG2E)))
        e.op("v_mul_f32", c[1], scale, v["tmp"], note="p = scale * hi")
        e.op("v_fma_f32", v["new_m"], scale, v["tmp"], f"-{c[1]}", note="its rounding error, exact")
        e.op("v_mov_b32", v["tmp"], hex(f32_bits(LOG2E - f32_value(f32_bits(LOG2E)))))
        e.op("v_fma_f32", v["new_m"], scale, v["tmp"], v["new_m"], note="+ scale * lo")
        e.op("v_add_f32", c[0], c[1], v["new_m"])
        e.op("v_mul_f32", c[0], s["qd"], c[0])
        e.op("v_mul_f32", c[0], s["kd"], c[0])
        e.op("v_mov_b32", c[1], c[0])
        e.op("s_mov_b32", s["tile"], jhi)
        e.label(".Ltile")
        self.query_tile()
        e.op("s_cmp_eq_u32", s["tile"], jlo)
        e.op("s_cbranch_scc1", ".Lnext_job")
        e.op("s_mov_b32", s["tile"], jlo)
        e.op("s_branch", ".Ltile")
        e.label(".Lnext_job")
        e.op("s_add_u32", s["job"], s["job"], s["grid"])
        e.op("s_branch", ".Ljob_loop")
        e.label(".Ldone")
        e.op("s_endpgm")

    def _set_base(self, tensor: str, arg: str, batch: str, head: str, elem_bytes: int) -> None:
        self._add_product(self.srd[tensor], self.arg_pair(arg),
                          [(batch, self.arg(f"{arg}_stride_b")), (head, self.arg(f"{arg}_stride_h"))], elem_bytes)

    def _add_product(self, srd, base_pair: str, products: list[tuple[str, str]], elem_bytes: int) -> None:
        """srd base = base + elem_bytes * sum(a*b) in 64 bits (products of 32-bit unsigned values)."""
        e, t = self.e, self.s_pair
        lo, hi = base_pair[2:-1].split(":")
        e.op("s_mov_b32", srd[0], f"s{lo}")
        e.op("s_mov_b32", srd[1], f"s{hi}")
        for a, b in products:
            e.op("s_mul_i32", t[0], a, b)
            e.op("s_mul_hi_u32", t[1], a, b)
            if elem_bytes > 1:
                e.op("s_lshl_b64", t.all, t.all, elem_bytes.bit_length() - 1)
            e.op("s_add_u32", srd[0], srd[0], t[0])
            e.op("s_addc_u32", srd[1], srd[1], t[1])
        e.op("s_and_b32", srd[1], srd[1], hex(0xFFFF), note="base_hi only: stride 0, no swizzle")

    # ---------------------------------------------------------------------------------------------- tile
    def query_tile(self) -> None:
        e, s, v = self.e, self.s, self.v
        e.section("query tile: 32 rows per wave, key tiles 0 .. num_tiles-1 through the LDS rings")
        e.op("s_lshl_b32", s["row0"], s["tile"], TILE_M.bit_length() - 1)
        e.op("s_mul_i32", s["tmp"], s["wave"], ROWS_PER_WAVE)
        e.op("s_add_u32", s["row0"], s["row0"], s["tmp"])
        e.op("s_lshl_b32", s["last_tile"], s["tile"], (TILE_M // TILE_N).bit_length() - 1)
        e.op("s_add_u32", s["last_tile"], s["last_tile"], TILE_M // TILE_N - 1, note="4 (tile + 1) - 1")
        e.op("s_waitcnt", "vmcnt(0)", note="previous tile's stores and ring loads are done")
        e.op("s_barrier", note="every wave left the previous tile: all ring slots are free")
        e.comment("Q^T operands straight into registers")
        e.op("s_mul_i32", s["soff"], s["row0"], self.arg("q_stride_s"))
        for c in range(self.k.qk_chunks):
            for part in range(2):
                e.op("buffer_load_dwordx4", self.q.span(8 * c + 4 * part, 4), v["q_off"], self.srd["q"].all,
                     s["soff"], mods=f"offen offset:{MFMA_K * c + 32 * part}")
        for i in range(self.o.count):
            e.op("v_mov_b32", self.o[i], 0)
        e.op("v_mov_b32", v["m"], v["neg_inf"], note="m unset")
        e.op("v_mov_b32", v["m_tau"], v["neg_inf"], note="m + tau: the first active tile always moves m")
        for i in range(self.lacc.count):
            e.op("v_mov_b32", self.lacc[i], 0)
        e.section("load ring: prologue fills slots 0-2")
        for n in range(PREFETCH):
            e.op("s_mov_b32", s["tmp2"], n)
            self.ring_load(s["tmp2"], n)
        if "drop_waitcnt" not in self.faults:
            e.op("s_waitcnt", f"vmcnt({(PREFETCH - 1) * self.loads_per_tile})",
                 note="this wave's share of key tile 0 (and Q) has landed")
        if "drop_barrier" not in self.faults:
            e.op("s_barrier", note="key tile 0 is complete in LDS (group A: iteration barrier of tile 0)")
        self.transpose_share(0, 0)
        e.op("s_waitcnt", "lgkmcnt(0)", note="this wave's V^T share of tile 0 is written")
        e.comment("ping-pong: group B passes one barrier more here, group A one more after the loop")
        e.op("s_cmp_eq_u32", s["group_b"], 0)
        e.op("s_cbranch_scc1", ".Lpong_start")
        e.op("s_barrier")
        e.label(".Lpong_start")
        e.op("s_mov_b32", s["key_tile"], 0)
        self.key_loop()
        e.op("s_cmp_eq_u32", s["group_b"], 1)
        e.op("s_cbranch_scc1", ".Lpong_end")
        e.op("s_barrier")
        e.label(".Lpong_end")
        self.epilogue()

    def ring_load(self, tile: str, slot: int) -> None:
        """Issue this wave's direct-to-LDS loads of key tile `tile` (SGPR) into ring slot `slot`."""
        e, s, k = self.e, self.s, self.k
        for tensor, regs, srd, row_bytes, stride, wave_base, tile_bytes in (
                ("K", self.v_kload, self.srd["k"], k.d_qk, "k_stride_s", s["share_k"], k.k_tile_bytes),
                ("V", self.v_vload, self.srd["v"], k.d_v, "v_stride_s", s["share_v"], k.v_tile_bytes)):
            chunk = ring_chunk_bytes(row_bytes)
            e.op("s_mul_i32", s["soff"], tile, self.arg(stride), note="first key row of the tile (stride x 64)")
            e.op("s_add_u32", "m0", wave_base, slot * tile_bytes, note="this wave's share of the slot")
            for i in range(regs.count):
                if i:
                    e.op("s_add_u32", "m0", "m0", WAVE_SIZE * chunk)
                e.op(f"buffer_load_dword{'x4' if chunk == 16 else ''}", regs[i], srd.all, s["soff"],
                     mods="offen lds", note=f"{tensor}: this wave's share of the tile, straight to LDS")

    def key_loop(self) -> None:
        """The key loop, unrolled by KEY_LOOP_UNROLL = RING_SLOTS: copy c handles the tiles n = c mod 4, so every K,
        V and V^T slot is a constant LDS offset. A query tile's 4 (tile + 1) key tiles are a multiple of the unroll
        factor."""
        e, s = self.e, self.s
        assert KEY_LOOP_UNROLL == RING_SLOTS and (TILE_M // TILE_N) % KEY_LOOP_UNROLL == 0
        e.label(".Lkey_loop")
        for copy in range(KEY_LOOP_UNROLL):
            self.sfx = f"_{copy}"
            self.key_tile_body(copy)
        self.sfx = ""
        e.op("s_cmp_le_u32", s["key_tile"], s["last_tile"])
        e.op("s_cbranch_scc1", ".Lkey_loop")

    def key_tile_body(self, copy: int) -> None:
        e, s, sfx = self.e, self.s, self.sfx
        e.section(f"key tile n = {copy} mod {KEY_LOOP_UNROLL}: K slot {copy}, V^T slot {copy % VT_SLOTS}")
        e.op("s_lshl_b32", s["key0"], s["key_tile"], TILE_N.bit_length() - 1)
        e.op("s_cmp_le_u32", s["key0"], s["row0"], note="key0 <= row0 + 31 (both are multiples of 32)")
        e.op("s_cselect_b32", s["active"], 1, 0, note="tile n holds a key <= this wave's last query")
        e.op("s_cbranch_scc0", f".Lqk_done{sfx}")
        self.qk(copy % RING_SLOTS)
        e.label(f".Lqk_done{sfx}")
        e.op("s_waitcnt", f"vmcnt({self.loads_per_tile}) lgkmcnt(0)",
             note="this wave's share of tile n+1 has landed")
        e.op("s_barrier", note="tile n+1 complete for the other group; slots of tile n-1 free")
        refill = (copy + PREFETCH) % RING_SLOTS
        e.comment(f"refill: tile min(n+{PREFETCH}, last) into slot {refill} (past the end: a harmless reload, so "
                  "every iteration waits for the same count)")
        e.op("s_add_u32", s["tmp2"], s["key_tile"], PREFETCH)
        e.op("s_min_u32", s["tmp2"], s["tmp2"], s["last_tile"])
        self.ring_load(s["tmp2"], refill)
        e.comment("every wave (with or without keys in tile n) writes its eighth of V^T for tile n+1 (the slot of")
        e.comment("tile n-1, which both groups have finished)")
        self.transpose_share((copy + 1) % RING_SLOTS, (copy + 1) % VT_SLOTS)
        e.op("s_cmp_eq_u32", s["active"], 0)
        e.op("s_cbranch_scc1", f".Lpv_done{sfx}")
        self.softmax()
        self.pv(copy % VT_SLOTS)
        e.label(f".Lpv_done{sfx}")
        e.op("s_waitcnt", "lgkmcnt(0)", note="V^T share of tile n+1 written")
        e.op("s_barrier", note="this group is done with tile n")
        e.op("s_add_u32", s["key_tile"], s["key_tile"], 1)

    def qk(self, slot: int) -> None:
        e, v, k = self.e, self.v, self.k
        e.section("QK: S^T = K Q^T for the two 32-key halves of tile n (K from LDS is the A operand)")
        for j in range(2):
            for c in range(k.qk_chunks):
                base = (j * k.qk_chunks + c) * MFMA_OPERAND_REGS
                for part in range(2):
                    e.op("ds_read_b128", self.kop.span(base + 4 * part, 4), v["k_read"],
                         mods=self._ds_offset(slot * k.k_tile_bytes + MFMA_ROWS * j * k.d_qk + MFMA_K * c + 32 * part))
        e.op("s_waitcnt", "lgkmcnt(0)")
        e.op("s_setprio", 1, note="matrix phase: let this wave win issue over its partner")
        for j in range(2):
            acc = self.sacc.span(MFMA_ACC_REGS * j, MFMA_ACC_REGS)
            for c in range(k.qk_chunks):
                base = (j * k.qk_chunks + c) * MFMA_OPERAND_REGS
                e.op(MFMA, acc, self.kop.span(base, MFMA_OPERAND_REGS), self.q.span(MFMA_OPERAND_REGS * c,
                                                                                    MFMA_OPERAND_REGS),
                     0 if c == 0 else acc)
        e.op("s_setprio", 0)

    def softmax(self) -> None:
        e, s, v, pr = self.e, self.s, self.v, self.pair
        x = [self.sacc[i] for i in range(self.sacc.count)]
        xp = [self.sacc.span(i, 2) for i in range(0, self.sacc.count, 2)]  # element pairs for v_pk_* math
        e.section("softmax: x = c*s, causal mask, lazy rescale (tau = 0.125), block exponent, P8")
        for r in xp:
            e.op("v_pk_mul_f32", r, pr["c"].all, r)
        e.comment("causal mask only where the tile reaches past this wave's first query")
        e.op("s_add_u32", s["tmp"], s["key0"], TILE_N - 1)
        e.op("s_cmp_le_u32", s["tmp"], s["row0"])
        e.op("s_cbranch_scc1", f".Lmask_done{self.sfx}")
        e.op("s_sub_u32", s["tmp"], s["key0"], s["row0"])
        e.op("v_sub_u32", v["thr"], v["mask_base"], s["tmp"], note="query - key of slot 0, per lane")
        e.comment(f"compares run {MASK_LAG} ahead of the selects, rotating over VCC and two SGPR pairs, so each")
        e.comment("v_cndmask finds its mask 2 wait states old (a VALU-written SGPR read by a VALU) without padding")
        masks = ["vcc", self.s_pair.all, self.s_mask.all]
        slots = [(j, r) for j in range(2) for r in range(MFMA_ACC_REGS)]
        for i in range(len(slots) + MASK_LAG):
            if i < len(slots):
                j, r = slots[i]
                e.op("v_cmp_le_i32", masks[i % len(masks)], MFMA_ROWS * j + 8 * (r // 4) + r % 4, v["thr"],
                     note="key of the slot <= query")
            if i >= MASK_LAG:
                j, r = slots[i - MASK_LAG]
                reg = x[MFMA_ACC_REGS * j + r]
                e.op("v_cndmask_b32", reg, v["neg_inf"], reg, masks[(i - MASK_LAG) % len(masks)])
        e.label(f".Lmask_done{self.sfx}")
        e.comment("tile maximum over this lane's 32 keys, then the other half-wave's 32")
        e.op("v_max3_f32", v["mt"], x[0], x[1], x[2])
        rest = x[3:]
        while len(rest) >= 2:
            e.op("v_max3_f32", v["mt"], v["mt"], rest[0], rest[1])
            rest = rest[2:]
        if rest:
            e.op("v_max_f32", v["mt"], v["mt"], rest[0])
        e.op("v_mov_b32", v["swap"], v["mt"])
        e.op("v_permlane32_swap_b32", v["swap"], v["swap"])
        e.op("v_max_f32", v["mt"], v["mt"], v["swap"])
        e.comment("lazy rescale: only rows whose maximum grew by more than tau move m (and scale O, l)")
        e.op("v_cmp_gt_f32", self.s_pair.all, v["mt"], v["m_tau"], note="mt > m + tau")
        e.op("s_or_b32", s["tmp"], self.s_pair[0], self.s_pair[1])
        e.op("s_cbranch_scc0", f".Lrescale_done{self.sfx}")
        alpha = pr["alpha"]
        e.op("v_cndmask_b32", v["new_m"], v["m"], v["mt"], self.s_pair.all)
        e.op("v_sub_f32", v["tmp"], v["m"], v["new_m"])
        e.op("v_mov_b32", v["m"], v["new_m"])
        e.op("v_add_f32", v["m_tau"], hex(f32_bits(TAU)), v["m"], note="m + tau and -m change only here")
        e.op("v_sub_f32", pr["neg_m"][0], 0, v["m"], note="m is finite here: every active tile has a key")
        e.op("v_exp_f32", alpha[0], v["tmp"], note="2^(m_old - m): 1 where unchanged, 0 on the first tile")
        for i in range(0, self.o.count, 2):
            e.op("v_pk_mul_f32", self.o.span(i, 2), alpha.all, self.o.span(i, 2), mods="op_sel_hi:[0,1]")
        e.op("v_mul_f32", self.l, alpha[0], self.l)
        e.label(f".Lrescale_done{self.sfx}")
        e.comment("block exponent e = floor(m - mb) (the tile is one 64-key block); y = (x - m) + e <= 0")
        e.comment("(op_sel_hi:[1,0]: the low register of a pair feeds both halves of a packed operation)")
        e.op("v_sub_f32", pr["e"][0], v["m"], v["mt"])
        e.op("v_floor_f32", pr["e"][0], pr["e"][0])
        e.op("v_cmp_ne_u32", self.s_pair.all, 0, pr["e"][0], note="e is +0.0 or a nonzero integer")
        e.op("s_or_b32", s["scaled"], self.s_pair[0], self.s_pair[1],
             note="kept for PV; scc = some lane has e != 0 (the VALU below leaves scc alone)")
        for r in xp:
            e.op("v_pk_add_f32", r, r, pr["neg_m"].all, mods="op_sel_hi:[1,0]", note="x - m")
        e.comment("where e = 0 on every lane, y = x - m exactly and 2^-e = 1 is never needed")
        if self.k.p_mode == "lean":
            self._lean_p(x, xp)
            return
        e.op("s_cbranch_scc0", f".Lblock_exp_done{self.sfx}")
        self._block_factor()
        for r in xp:
            e.op("v_pk_add_f32", r, r, pr["e"].all, mods="op_sel_hi:[1,0]", note="(x - m) + e")
        e.label(f".Lblock_exp_done{self.sfx}")
        e.comment("exact P: P8 = e4m3(2^y * 2^8), round to nearest even (the offset is exact: 2^y >= 2^-126 or 0)")
        for r in x:
            e.op("v_exp_f32", r, r)
        for r in xp:
            e.op("v_pk_mul_f32", r, pr["p_offset"].all, r, mods="op_sel_hi:[0,1]")
        for g in range(self.p.count):
            b = x[4 * g:4 * g + 4]
            e.op("v_cvt_pk_fp8_f32", self.p[g], b[0], b[1])
            e.op("v_cvt_pk_fp8_f32", self.p[g], b[2], b[3], mods="op_sel:[0,0,1]")

    def _block_factor(self) -> None:
        e, pr = self.e, self.pair
        e.op("v_cvt_i32_f32", self.v["ei"], f"-{pr['e'][0]}", note="-e as an integer")
        e.op("v_ldexp_f32", pr["fac"][0], 1.0, self.v["ei"], note="2^-e, exact")

    def _lean_p(self, x: list[str], xp: list[str]) -> None:
        """code = max(0, rne(8y + 120)) (P written 2^8 larger: 120 is the e4m3 code of 2^8): one packed FMA per
        element pair forms the model's FP32 value fl(8y + 120) (8y is exact), and one v_cvt_pk_u8_f32 per element
        rounds it to nearest even, saturates to [0, 255] (negative values and -inf become 0, the model's max(0, .);
        y <= 0 keeps it <= 120) and inserts the byte into its P register (bytes in key order)."""
        e, s, pr = self.e, self.s, self.pair
        e.comment("lean P: w = 8y + 120 in FP32, then v_cvt_pk_u8_f32 rounds, saturates and packs the code")

        def w_step(offset: str, sel: str, note: str) -> None:
            for r in xp:
                e.op("v_pk_fma_f32", r, r, pr["lean_w"].all, offset, mods=f"op_sel:[0,0,{sel[0]}] "
                     f"op_sel_hi:[1,0,{sel[1]}]", note=note)

        e.op("s_cbranch_scc0", f".Lexp_zero{self.sfx}")
        self._block_factor()
        e.op("v_cmp_gt_f32", self.s_pair.all, 0, pr["e"][0], note="e = -1: the block maximum exceeds m (by <= tau)")
        e.op("s_or_b32", s["tmp"], self.s_pair[0], self.s_pair[1])
        e.op("s_cbranch_scc1", f".Lexp_negative{self.sfx}")
        e.comment("every e >= 0: t = x - m <= -e, so t + e is exact (|t + e| <= |t|, e an integer), and with it")
        e.comment("8y + 120 = 8t + (8e + 120) (an exact offset for e < 2^21 - 15; larger e has 2^-e = 0): one FMA")
        e.op("v_fma_f32", pr["woff"][0], pr["e"][0], pr["lean_w"][0], pr["lean_w"][1], note="8e + 120")
        w_step(pr["woff"].all, "00", "w = 8 (x - m) + (8e + 120)")
        e.op("s_branch", f".Lw_done{self.sfx}")
        e.label(f".Lexp_negative{self.sfx}")
        e.comment("some e = -1: y = (x - m) + e rounds in general, so as the model: y first, then w")
        for r in xp:
            e.op("v_pk_add_f32", r, r, pr["e"].all, mods="op_sel_hi:[1,0]", note="y = (x - m) + e")
        w_step(pr["lean_w"].all, "11", "w = 8y + 120")
        e.op("s_branch", f".Lw_done{self.sfx}")
        e.label(f".Lexp_zero{self.sfx}")
        w_step(pr["lean_w"].all, "11", "w = 8y + 120 (y = x - m)")
        e.label(f".Lw_done{self.sfx}")
        for k in range(KEY_GROUP):
            for g in range(self.p.count):
                e.op("v_cvt_pk_u8_f32", self.p[g], x[KEY_GROUP * g + k], k, 0 if k == 0 else self.p[g],
                     note=f"byte {k}: the code of key {KEY_GROUP} g + {k}" if g == 0 else "")

    def transpose_share(self, v_slot: int, vt_slot: int) -> None:
        """Write this wave's eighth of V^T: operand register g = wave of every d_v group, for every lane.

        v_slot / vt_slot: the V ring slot holding the tile and the V^T slot to fill."""
        e, v, k = self.e, self.v, self.k
        e.comment(f"V^T share: V slot {v_slot} -> V^T slot {vt_slot}: 4 keys x 4 columns per lane, a 4x4 byte "
                  "transpose (8 v_perm_b32), 4 writes")
        a = [self.vraw[kk] for kk in range(KEY_GROUP)]
        for kk in range(KEY_GROUP):
            e.op("ds_read_b32", a[kk], v["v_read"], mods=self._ds_offset(v_slot * k.v_tile_bytes + kk * k.d_v))
        e.op("s_waitcnt", "lgkmcnt(0)")
        t = [self.tr[i] for i in range(4)]
        sel_lo, sel_hi, half_lo, half_hi = (self.s_perm[i] for i in range(4))
        e.op("v_perm_b32", t[0], a[1], a[0], sel_lo)
        e.op("v_perm_b32", t[1], a[1], a[0], sel_hi)
        e.op("v_perm_b32", t[2], a[3], a[2], sel_lo)
        e.op("v_perm_b32", t[3], a[3], a[2], sel_hi)
        e.op("v_perm_b32", a[0], t[2], t[0], half_lo, note="column 4*(l%32) + 0 of the 4 keys")
        e.op("v_perm_b32", a[1], t[2], t[0], half_hi)
        e.op("v_perm_b32", a[2], t[3], t[1], half_lo)
        e.op("v_perm_b32", a[3], t[3], t[1], half_hi)
        for i in range(k.d_v // MFMA_ROWS):
            e.op("ds_write_b32", v["vt_write"], a[i], mods=self._ds_offset(vt_slot * k.vt_slot_bytes
                                                                            + i * k.vt_group_bytes))

    @staticmethod
    def _ds_offset(offset: int) -> str:
        if not 0 <= offset <= DS_OFFSET_LIMIT:
            raise ValueError(f"LDS offset {offset} does not fit the 16-bit offset field")
        return f"offset:{offset}"

    def pv(self, vt_slot: int) -> None:
        e, v, k = self.e, self.v, self.k
        e.section("PV: O^T += 2^-e * V^T P8^T per d_v group; l += 2^-e * (ones^T P8^T)")
        for i in range(self.va.count // MFMA_OPERAND_REGS):
            for part in range(2):
                e.op("ds_read_b128", self.va.span(MFMA_OPERAND_REGS * i + 4 * part, 4), v["vt_lane"],
                     mods=self._ds_offset(vt_slot * k.vt_slot_bytes + i * k.vt_group_bytes + 16 * part))
        e.op("s_waitcnt", "lgkmcnt(0)")
        e.op("s_setprio", 1)
        operands = [self.va.span(MFMA_OPERAND_REGS * i, MFMA_OPERAND_REGS) for i in range(4)] + [self.ones.all]
        e.comment("e = 0 on every lane (the common case): 2^-e = 1, so the MFMAs accumulate into O and l directly")
        e.op("s_cmp_lg_u32", self.s["scaled"], 0, note="set in the softmax: some lane has e != 0")
        e.op("s_cbranch_scc1", f".Lpv_scaled{self.sfx}")
        for i, a in enumerate(operands):
            acc = self.lacc.all if i == 4 else self.o.span(MFMA_ACC_REGS * i, MFMA_ACC_REGS)
            e.op(MFMA, acc, a, self.p.all, acc, note="row sum" if i == 4 else f"d_v columns 4*row + {i}")
        e.op("s_branch", f".Lpv_end{self.sfx}")
        e.label(f".Lpv_scaled{self.sfx}")
        e.comment("some lane has e != 0: block products into a buffer, then O += 2^-e * product (exact scaling)")
        for i, a in enumerate(operands):
            e.op(MFMA, self.part.span(MFMA_ACC_REGS * (i % 2), MFMA_ACC_REGS), a, self.p.all, 0,
                 note="row sum" if i == 4 else f"d_v columns 4*row + {i}")
            if i:
                self._accumulate(i - 1)
        self._accumulate(len(operands) - 1)
        e.label(f".Lpv_end{self.sfx}")
        e.op("s_setprio", 0)

    def _accumulate(self, i: int) -> None:
        e, fac = self.e, self.pair["fac"]
        base = MFMA_ACC_REGS * (i % 2)
        if i == 4:
            e.op("v_fmac_f32", self.l, self.part[base], fac[0], note="every row of ones^T P8^T is the column sum")
            return
        for r in range(0, MFMA_ACC_REGS, 2):
            o = self.o.span(MFMA_ACC_REGS * i + r, 2)
            e.op("v_pk_fma_f32", o, self.part.span(base + r, 2), fac.all, o, mods="op_sel_hi:[1,0,1]")

    def epilogue(self) -> None:
        e, s, v, scale = self.e, self.s, self.v, self.pair["scale"]
        e.section("epilogue: O / l * v_descale -> BF16, lse = ln2 * (m + (log2 l - 8)) (l is 2^8 too large)")
        e.op("v_rcp_f32", v["tmp"], self.l)
        e.op("v_mul_f32", scale[0], s["vd"], v["tmp"])
        e.op("v_mov_b32", scale[1], scale[0])
        for i in range(0, self.o.count, 2):
            e.op("v_pk_mul_f32", self.o.span(i, 2), scale.all, self.o.span(i, 2))
        for r in range(MFMA_ACC_REGS):
            cols = [self.o[MFMA_ACC_REGS * i + r] for i in range(4)]
            e.op("v_cvt_pk_bf16_f32", self.out_pk[2 * r], cols[0], cols[1])
            e.op("v_cvt_pk_bf16_f32", self.out_pk[2 * r + 1], cols[2], cols[3])
        e.op("s_mul_i32", s["soff"], s["row0"], self.arg("out_stride_s"))
        e.op("s_lshl_b32", s["soff"], s["soff"], BYTES_BF16.bit_length() - 1)
        for r in range(MFMA_ACC_REGS):
            col = 4 * key_of_slot(0, r)  # accumulator row 8*(r/4) + r%4 (+4*half in o_off) holds columns 4*row + i
            e.op("buffer_store_dwordx2", self.out_pk.span(2 * r, 2), v["o_off"], self.srd["out"].all, s["soff"],
                 mods=f"offen offset:{col * BYTES_BF16}")
        e.op("v_log_f32", v["tmp"], self.l)
        e.op("v_add_f32", v["tmp"], hex(f32_bits(-float(P_SHIFT))), v["tmp"],
             note="log2 l - 8, exact: l >= 2^7 (the largest P of a row is), so log2 l lies in [7, 2^26)")
        e.op("v_add_f32", v["tmp"], v["m"], v["tmp"])
        e.op("v_mul_f32", v["tmp"], hex(f32_bits(LN2)), v["tmp"])
        e.op("s_lshl_b32", s["soff"], s["row0"], BYTES_F32.bit_length() - 1)
        e.op("s_mov_b32", "exec_hi", 0, note="lanes 0-31 hold the 32 rows")
        e.op("buffer_store_dword", v["tmp"], v["lse_off"], self.srd["lse"].all, s["soff"], mods="offen")
        e.op("s_mov_b32", "exec_hi", -1)

    # ---------------------------------------------------------------------------------------------- wrapper
    def wrap(self, body: str) -> str:
        k = self.k
        vgprs = self.r.count("v")
        sgprs = self.r.count("s")
        accum_offset = -(-vgprs // 4) * 4
        header = [f"// {k.symbol}: causal FP8 attention forward for gfx950, d_qk={k.d_qk}, d_v={k.d_v}, "
                  f"{k.p_mode} P", "// generated by asmgen.gfx950 (do not edit)", "//"]
        header += ["// " + line for line in self.r.comment_block()]
        lines = header + [
            "", '.amdgcn_target "amdgcn-amd-amdhsa--gfx950"', ".text", f".globl {k.symbol}", ".p2align 8",
            f".type {k.symbol},@function", f"{k.symbol}:", body.rstrip("\n"), f".size {k.symbol}, .-{k.symbol}", "",
            ".rodata", ".p2align 6", f".amdhsa_kernel {k.symbol}",
            f"  .amdhsa_group_segment_fixed_size {k.lds_bytes}",
            f"  .amdhsa_kernarg_size {kernarg_bytes()}",
            "  .amdhsa_user_sgpr_count 4",
            "  .amdhsa_user_sgpr_dispatch_ptr 1",
            "  .amdhsa_user_sgpr_kernarg_segment_ptr 1",
            "  .amdhsa_system_sgpr_workgroup_id_x 1",
            "  .amdhsa_system_vgpr_workitem_id 0",
            f"  .amdhsa_next_free_vgpr {vgprs}",
            f"  .amdhsa_next_free_sgpr {sgprs}",
            f"  .amdhsa_accum_offset {accum_offset}",
            "  .amdhsa_ieee_mode 0",
            "  .amdhsa_dx10_clamp 0",
            ".end_amdhsa_kernel", "", self.metadata(vgprs, sgprs)]
        return "\n".join(lines) + "\n"

    def metadata(self, vgprs: int, sgprs: int) -> str:
        k = self.k
        args = []
        offsets = arg_offsets()
        for name, kind in ARGS:
            if kind == "ptr":
                args.append(f"      - {{ .name: {name}, .offset: {offsets[name]}, .size: 8, "
                            ".value_kind: global_buffer, .address_space: global }")
            else:
                args.append(f"      - {{ .name: {name}, .offset: {offsets[name]}, .size: {ARG_SIZE[kind]}, "
                            ".value_kind: by_value }")
        return "\n".join([
            ".amdgpu_metadata", "---", "amdhsa.version: [ 1, 2 ]", "amdhsa.target: amdgcn-amd-amdhsa--gfx950",
            "amdhsa.kernels:",
            f"  - .name: {k.symbol}", f"    .symbol: {k.symbol}.kd",
            f"    .kernarg_segment_size: {kernarg_bytes()}", "    .kernarg_segment_align: 8",
            f"    .group_segment_fixed_size: {k.lds_bytes}", "    .private_segment_fixed_size: 0",
            "    .wavefront_size: 64", f"    .sgpr_count: {sgprs}", f"    .vgpr_count: {vgprs}",
            "    .agpr_count: 0", f"    .max_flat_workgroup_size: {WAVES * WAVE_SIZE}",
            "    .args:", *args, "...", ".end_amdgpu_metadata"])
