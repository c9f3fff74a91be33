"""The numerics model: causal attention computed exactly the way the kernels compute it.

This is "The numerics" of the design written out in torch, the contract every backend is tested against.
Per query row, in base-2 units x = c * (q . k) with c = softmax_scale * log2(e) (times q_descale * k_descale
for FP8), keys are visited in tiles of `key_tile` in increasing order; the row keeps a reference maximum m
(lazily raised when a tile's maximum exceeds it by more than tau), a row sum l and an FP32 accumulator O.

- BF16 (p_mode "bf16"): p = 2^(x - m) in FP32, l += sum p, O += bf16(p) V.
- FP8 (p_mode "lean" / "exact"), per block of `scale_block` keys: e = floor(m - max_block x),
  y = x - m + e, P8 = e4m3 code max(0, rne(8y + 56)) (lean) or e4m3(2^y) (exact),
  O += 2^-e (P8 V8) and l += 2^-e sum P8.
- End: out = bf16(O / l * v_descale), lse = ln(2) * (m + log2 l).

Choices where the contract leaves the last bit open, made so the model is canonical (independent of summation
order): every dot product (a score q . k, a block's P8 V8, a tile's P V, a sum of probabilities) is formed in
float64 (exact for FP8 data, and for BF16 data short of extreme exponent ranges) and rounded once to FP32; 2^t
is the FP32 rounding of the exact power. The FP32 operations, in order: c = fp32(fp32(softmax_scale) * log2(e)) *
q_descale * k_descale; x = c * s; tau compared as mt > m + tau; y = (x - m) + e; lean code = rne(8y + 56);
out = (O / l) * v_descale. A kernel differs from the model only by the order of its FP32 additions, its exp2
unit's last bit and fused multiply-adds.

Two switches reproduce the peers' numerics for comparison: block_scale=False (e = 0 for every block: P is
rounded relative to the row maximum, as AITER and FA3 do) and rowsum="fp32" (l sums the unrounded FP32
probabilities instead of the rounded ones that multiply V, as FA3 does). p_shift scales P by 2^p_shift before
the FP8 rounding (FA3 uses 8) so that small probabilities fall off e4m3's range later; it cancels in O / l.

Work is done tile by tile on chunks of query rows of all heads at once, so memory stays bounded (no
seqlen x seqlen tensor) while every step is a batched tensor operation.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

import torch

FP8_DTYPE = torch.float8_e4m3fn
P_MODES = ("bf16", "lean", "exact")
ROWSUMS = ("rounded", "fp32")

LOG2E = 1.0 / math.log(2.0)
LN2 = math.log(2.0)

# Lazy-rescale thresholds tau, in binades (the contract's values per configuration).
FP8_RESCALE_THRESHOLD = 0.125
BF16_RESCALE_THRESHOLD = 0.5
BF16_WIDE_RESCALE_THRESHOLD = 8.0  # d_qk = 192: the rare rescale is worth more than the headroom
WIDE_HEAD_DIM = 192  # heads this wide use exact P (FP8) and the wide tau (BF16)

# e4m3 bit patterns: the code grows by 8 per doubling (3 mantissa bits) and 56 is the code of 1.0.
E4M3_CODES_PER_BINADE = 8
E4M3_ONE_CODE = 56
E4M3_LARGEST_FINITE = 448.0
# P8 must stay below e4m3's largest value (and its codes below 0x7E, see FA4 #2577): headroom in binades.
MAX_P_EXPONENT = math.log2(E4M3_LARGEST_FINITE) - 1 / E4M3_CODES_PER_BINADE

# Scores held per step (rows x keys x heads): bounds the model's memory to some tens of MiB.
SCORES_PER_STEP = 1 << 21
# Query rows per step, at most: a chunk of rows also visits the keys only its last rows see (causal waste).
MAX_ROWS_PER_STEP = 512


@dataclass(frozen=True)
class Config:
    """The resolved numerics of one call (every default filled in)."""

    p_mode: str
    block_scale: bool
    rowsum: str
    rescale_threshold: float
    key_tile: int
    scale_block: int
    p_shift: int

    @property
    def fp8(self) -> bool:
        return self.p_mode != "bf16"


def fp32(x: float) -> float:
    """x rounded to the nearest FP32 value: kernels receive softmax_scale as an FP32 argument."""
    return struct.unpack("f", struct.pack("f", x))[0]


def default_p_mode(dtype: torch.dtype, d_qk: int) -> str:
    """The kernels' probability format: BF16 inputs bf16; FP8 lean at d=128, exact for wide heads."""
    if dtype == torch.bfloat16:
        return "bf16"
    return "exact" if d_qk >= WIDE_HEAD_DIM else "lean"


def default_rescale_threshold(p_mode: str, d_qk: int) -> float:
    """The kernels' lazy-rescale threshold tau for a configuration."""
    if p_mode != "bf16":
        return FP8_RESCALE_THRESHOLD
    return BF16_WIDE_RESCALE_THRESHOLD if d_qk >= WIDE_HEAD_DIM else BF16_RESCALE_THRESHOLD


def default_rowsum(p_mode: str) -> str:
    """FP8 kernels sum the rounded probabilities (weights sum to one); BF16 kernels the FP32 ones."""
    return "fp32" if p_mode == "bf16" else "rounded"


def resolve_config(dtype: torch.dtype, d_qk: int, *, p_mode=None, block_scale=True, rowsum=None,
                   rescale_threshold=None, key_tile=128, scale_block=64, p_shift=0) -> Config:
    """Fill in the kernels' defaults for (dtype, d_qk) and check every numerics option."""
    if dtype not in (torch.bfloat16, FP8_DTYPE):
        raise TypeError(f"inputs must be torch.bfloat16 or torch.float8_e4m3fn, got {dtype}")
    p_mode = default_p_mode(dtype, d_qk) if p_mode is None else p_mode
    if p_mode not in P_MODES:
        raise ValueError(f"p_mode must be one of {P_MODES}, got {p_mode!r}")
    if (p_mode == "bf16") != (dtype == torch.bfloat16):
        raise ValueError(f"p_mode={p_mode!r} does not fit {dtype} inputs: 'bf16' is for BF16 inputs, "
                         "'lean' and 'exact' for float8_e4m3fn inputs")
    rowsum = default_rowsum(p_mode) if rowsum is None else rowsum
    if rowsum not in ROWSUMS:
        raise ValueError(f"rowsum must be one of {ROWSUMS}, got {rowsum!r}")
    tau = default_rescale_threshold(p_mode, d_qk) if rescale_threshold is None else float(rescale_threshold)
    if not (math.isfinite(tau) and tau >= 0):
        raise ValueError(f"rescale_threshold must be a finite number >= 0, got {rescale_threshold!r}")
    if not (isinstance(key_tile, int) and key_tile > 0):
        raise ValueError(f"key_tile must be a positive int, got {key_tile!r}")
    if not (isinstance(scale_block, int) and scale_block > 0 and key_tile % scale_block == 0):
        raise ValueError(f"scale_block must be a positive int dividing key_tile={key_tile}, got {scale_block!r}")
    if not isinstance(p_shift, int) or p_shift < 0 or (p_shift and p_mode == "bf16"):
        raise ValueError(f"p_shift must be an int >= 0, and 0 for p_mode 'bf16', got {p_shift!r}")
    # Without block scaling a probability reaches 2^tau before its row's reference maximum is raised.
    headroom = p_shift + (0.0 if block_scale else tau)
    if p_mode != "bf16" and headroom > MAX_P_EXPONENT:
        raise ValueError(f"p_shift={p_shift} with block_scale={block_scale} and rescale_threshold={tau} lets P "
                         f"reach 2^{headroom}, beyond e4m3's range (at most 2^{MAX_P_EXPONENT:.3f})")
    return Config(p_mode, bool(block_scale), rowsum, tau, key_tile, scale_block, p_shift)


def attention(q, k, v, *, softmax_scale=None, q_descale=1.0, k_descale=1.0, v_descale=1.0, p_mode=None,
              block_scale=True, rowsum=None, rescale_threshold=None, key_tile=128, scale_block=64, p_shift=0,
              return_lse=False):
    """Causal attention with the kernels' numerics.

    q: (batch, seqlen, heads, d_qk), k: (batch, seqlen, heads_k, d_qk), v: (batch, seqlen, heads_k, d_v),
    all torch.bfloat16 or all torch.float8_e4m3fn; query head h uses key/value head h // (heads / heads_k).
    softmax_scale: defaults to 1/sqrt(d_qk). Descales (FP8 only): floats or float32 tensors broadcastable to
    (batch, heads_k), the per (batch, kv head) factors that decode the stored values.
    p_mode: "bf16" | "lean" | "exact" (default: the kernels' choice for the dtype and d_qk).
    block_scale: per-block power-of-two scaling of FP8 probabilities (False: relative to the row maximum).
    rowsum: "rounded" (sum the probabilities that multiply V) or "fp32" (sum the unrounded ones); default the
    kernels' choice: "rounded" for FP8, "fp32" for BF16.
    rescale_threshold: tau in binades (default the contract's per configuration).
    key_tile, scale_block: keys per tile and per FP8 scaling block. p_shift: see the module docstring.
    Returns out (batch, seqlen, heads, d_v) BF16 and, with return_lse, lse (batch, heads, seqlen) float32.
    """
    batch, seqlen, heads, heads_k = _check_shapes(q, k, v)
    cfg = resolve_config(q.dtype, q.shape[-1], p_mode=p_mode, block_scale=block_scale, rowsum=rowsum,
                         rescale_threshold=rescale_threshold, key_tile=key_tile, scale_block=scale_block,
                         p_shift=p_shift)
    scale = 1.0 / math.sqrt(q.shape[-1]) if softmax_scale is None else float(softmax_scale)
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"softmax_scale must be a positive finite number, got {softmax_scale!r}")
    descales = {"q_descale": q_descale, "k_descale": k_descale, "v_descale": v_descale}
    if cfg.fp8:
        qd, kd, vd = (_per_kv_head(value, name, batch, heads_k, q.device) for name, value in descales.items())
    else:
        for name, value in descales.items():
            if not (value is None or (isinstance(value, (int, float)) and value == 1.0)):
                raise ValueError(f"{name} applies to FP8 inputs only; BF16 inputs take 1.0 or None")
        qd = kd = vd = torch.ones(batch, heads_k, dtype=torch.float32, device=q.device)
    c = ((torch.tensor(fp32(scale) * LOG2E, dtype=torch.float32) * qd) * kd)[:, :, None, None, None]
    vd = vd[:, :, None, None, None]

    group = heads // heads_k
    # Exact decoding; queries of a GQA group become extra rows of their key/value head: (b, hk, g, s, d).
    qg = q.double().permute(0, 2, 1, 3).reshape(batch, heads_k, group, seqlen, -1)
    kh, vh = (t.double().permute(0, 2, 1, 3) for t in (k, v))
    out = torch.empty(batch, heads_k, group, seqlen, v.shape[-1], dtype=torch.bfloat16, device=q.device)
    lse = torch.empty(batch, heads_k, group, seqlen, dtype=torch.float32, device=q.device)
    rows_per_step = max(1, min(MAX_ROWS_PER_STEP, SCORES_PER_STEP // (batch * heads * cfg.key_tile)))
    for first in range(0, seqlen, rows_per_step):
        last = min(seqlen, first + rows_per_step)
        o, l, m = _causal_rows(qg[:, :, :, first:last], kh[:, :, :last], vh[:, :, :last], c, first, cfg)
        out[:, :, :, first:last] = ((o / l[..., None]) * vd).to(torch.bfloat16)
        lse[:, :, :, first:last] = (LN2 * (m.double() - cfg.p_shift + torch.log2(l.double()))).float()
    out = out.reshape(batch, heads, seqlen, -1).permute(0, 2, 1, 3).contiguous()
    if return_lse:
        return out, lse.reshape(batch, heads, seqlen)
    return out


def _check_shapes(q, k, v):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{name} must be a 4-D tensor (batch, seqlen, heads, dim)")
        if t.numel() == 0:
            raise ValueError(f"{name} has shape {tuple(t.shape)}: every dimension must be at least 1")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    batch, seqlen, heads, d_qk = q.shape
    if k.shape[:2] != (batch, seqlen) or v.shape[:2] != (batch, seqlen):
        raise ValueError(f"q, k, v must share (batch, seqlen): got {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    heads_k = k.shape[2]
    if v.shape[2] != heads_k or heads % heads_k:
        raise ValueError(f"k and v must have the same number of heads dividing q's {heads}: got k {heads_k}, "
                         f"v {v.shape[2]}")
    if k.shape[3] != d_qk:
        raise ValueError(f"q and k must share the head dimension: got {d_qk} and {k.shape[3]}")
    return batch, seqlen, heads, heads_k


def _per_kv_head(value, name, batch, heads_k, device):
    """A descale as a float32 (batch, heads_k) tensor of positive finite values."""
    if isinstance(value, torch.Tensor):
        if value.dtype != torch.float32:
            raise TypeError(f"{name} must be float32, got {value.dtype}")
        try:
            value = torch.broadcast_to(value.to(device), (batch, heads_k))
        except RuntimeError:
            raise ValueError(f"{name} of shape {tuple(value.shape)} does not broadcast to (batch, heads_k) = "
                             f"({batch}, {heads_k})") from None
    elif isinstance(value, (int, float)):
        value = torch.full((batch, heads_k), float(value), dtype=torch.float32, device=device)
    else:
        raise TypeError(f"{name} must be a float or a float32 tensor, got {type(value).__name__}")
    if not bool(torch.all(torch.isfinite(value) & (value > 0))):
        raise ValueError(f"{name} must hold positive finite values")
    return value


def _exp2(t: torch.Tensor) -> torch.Tensor:
    """2^t rounded once to FP32."""
    return torch.exp2(t.double()).float()


def _round_to_fp32(exact: torch.Tensor) -> torch.Tensor:
    """A sum or dot product formed exactly in float64, rounded once to FP32."""
    return exact.float()


def _causal_rows(q, k, v, c, first_row, cfg: Config):
    """Run rows first_row.. of every (batch, head) over their key tiles; returns FP32 O, l and m.

    q: (b, hk, g, rows, d_qk) float64; k, v: (b, hk, keys, d) float64 (the keys the rows can see).
    """
    rows = torch.arange(first_row, first_row + q.shape[3], device=q.device)
    m = torch.full(q.shape[:-1], -math.inf, dtype=torch.float32, device=q.device)
    l = torch.zeros_like(m)
    o = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=torch.float32, device=q.device)
    for start in range(0, k.shape[2], cfg.key_tile):
        stop = min(k.shape[2], start + cfg.key_tile)
        s = _round_to_fp32(torch.einsum("bhgrd,bhnd->bhgrn", q, k[:, :, start:stop]))
        x = c * s
        if stop - 1 > first_row:  # some key of the tile lies after some row: mask it
            keys = torch.arange(start, stop, device=q.device)
            x = x.masked_fill(keys[None, :] > rows[:, None], -math.inf)
        # Lazy rescaling. Every row sees key 0 in tile 0, so m is finite from then on.
        tile_max = x.amax(dim=-1)
        raise_m = (m == -math.inf) | (tile_max > m + cfg.rescale_threshold)
        new_m = torch.where(raise_m, tile_max, m)
        alpha = torch.where(raise_m, _exp2(m - new_m), torch.ones_like(m))
        o *= alpha[..., None]
        l *= alpha
        m = new_m
        step = _fp8_tile if cfg.fp8 else _bf16_tile
        step(x, m, v[:, :, start:stop], cfg, o, l)
    return o, l, m


def _bf16_tile(x, m, v, cfg: Config, o, l):
    """O += bf16(p) V, l += sum p (or sum bf16(p)), with p = 2^(x - m) in FP32."""
    p = _exp2(x - m[..., None])
    p16 = p.to(torch.bfloat16)
    summed = p16 if cfg.rowsum == "rounded" else p
    l += _round_to_fp32(summed.double().sum(dim=-1))
    o += _round_to_fp32(torch.einsum("bhgrn,bhnd->bhgrd", p16.double(), v))


def _fp8_tile(x, m, v, cfg: Config, o, l):
    """Per block of scale_block keys: O += 2^-e (P8 V8), l += 2^-e sum P8 (or the unrounded sum)."""
    keys = x.shape[-1]
    blocks = -(-keys // cfg.scale_block)
    pad = blocks * cfg.scale_block - keys  # a partial last tile (seqlen not a multiple of the block)
    if pad:
        x = torch.nn.functional.pad(x, (0, pad), value=-math.inf)
        v = torch.nn.functional.pad(v, (0, 0, 0, pad))
    xb = x.unflatten(-1, (blocks, cfg.scale_block))  # (b, hk, g, rows, blocks, scale_block)
    vb = v.unflatten(2, (blocks, cfg.scale_block))  # (b, hk, blocks, scale_block, d_v)
    block_max = xb.amax(dim=-1)
    if cfg.block_scale:
        # A block with no visible key for the row contributes nothing: give it e = 0 so y stays -inf, not NaN.
        e = torch.where(block_max > -math.inf, torch.floor(m[..., None] - block_max), torch.zeros_like(block_max))
    else:
        e = torch.zeros_like(block_max)
    y = (xb - m[..., None, None]) + e[..., None]
    p8 = lean_p(y, cfg.p_shift) if cfg.p_mode == "lean" else exact_p(y, cfg.p_shift)
    weight = torch.ldexp(torch.ones_like(e), -e)  # 2^-e, exact
    products = _round_to_fp32(torch.einsum("bhgrks,bhksd->bhgrkd", p8.double(), vb))
    summed = p8 if cfg.rowsum == "rounded" else _exp2(y) * 2.0**cfg.p_shift
    sums = _round_to_fp32(summed.double().sum(dim=-1))
    for b in range(blocks):
        o += weight[..., b, None] * products[..., b, :]
        l += weight[..., b] * sums[..., b]


def lean_codes(y: torch.Tensor, p_shift: int = 0) -> torch.Tensor:
    """Lean P's e4m3 codes max(0, rne(8y + 56 + 8 p_shift)) as uint8, from FP32 exponents y (-inf -> 0)."""
    offset = float(E4M3_ONE_CODE + E4M3_CODES_PER_BINADE * p_shift)
    codes = torch.round(y.float() * E4M3_CODES_PER_BINADE + offset).clamp_min(0)  # torch.round: half to even
    return codes.to(torch.uint8)


def lean_p(y: torch.Tensor, p_shift: int = 0) -> torch.Tensor:
    """Lean P: the e4m3 value whose bit pattern is lean_codes(y), as FP32."""
    return lean_codes(y, p_shift).view(FP8_DTYPE).float()


def exact_p(y: torch.Tensor, p_shift: int = 0) -> torch.Tensor:
    """Exact P: e4m3(2^(y + p_shift)) rounded to nearest even from FP32, as FP32."""
    return (_exp2(y) * 2.0**p_shift).to(FP8_DTYPE).float()
