"""The numerics model: causal attention computed exactly the way the kernels compute it.

This is the numerics contract of docs/design.md written out in torch; every backend is tested against it.
Per query row, in base-2 units x = c * (q . k) with c = softmax_scale * log2(e) (times q_descale * k_descale
for FP8), keys are visited in tiles of `key_tile` in increasing order; the row keeps a reference maximum m
(lazily raised when a tile's maximum exceeds it by more than tau), a row sum l and an FP32 accumulator O.

- BF16 (p_mode "bf16"): p = 2^(x - m) in FP32, l += sum p, O += bf16(p) V.
- FP8 (p_mode "exact" / "lean"), per block of `scale_block` keys: e = floor(m - max_block x) (an integer >= -1)
  and y = x - m + e + p_shift, so the block's largest value lies in (p_shift - 1, p_shift]; p_shift = 8 writes P
  2^8 larger than the probability, which puts e4m3's upper binades to use and keeps values down to 17 binades
  below the block maximum out of the subnormals and zero.
  exact P: P8 = e4m3(2^y), round to nearest even. lean P: P8 = the e4m3 value whose bit pattern is
  max(0, rne(8y + 56)) (at most 56 + 8 p_shift = 120; e4m3's code grows by 8 per doubling and 56 is 1.0).
  O += 2^-e (P8 V8) and l += 2^-e sum P8: the row sum adds the rounded probabilities that multiply V.
- End: out = bf16(O / l * v_descale), lse = ln(2) * (m - p_shift + log2 l) (natural log, FP32).
The contract's defaults: FP8 exact P, p_shift 8, 64-key scale blocks, rounded row sum, tau 0.125; BF16 FP32 row
sum, tau 0.5 (d_qk 128) or 8 (d_qk 192). A kernel's own choices are its manifest entry (`config_from_kernel`).

Choices where the contract leaves the last bit open, made so the model is canonical (independent of summation
order): every dot product (a score q . k, a block's P8 V8, a tile's P V, a sum of probabilities) is formed in
float64 (exact for FP8 data, and for BF16 data short of extreme exponent ranges) and rounded once to FP32; 2^t
is the FP32 rounding of the exact power. The FP32 operations, in order: c = fp32(fp32(softmax_scale) * log2(e)) *
q_descale * k_descale; x = c * s; tau compared as mt > m + tau; t = (x - m) + e; the offset enters exactly, as the
constant of the one operation that follows: lean code = rne(8t + (56 + 8 p_shift)) (one FP32 rounding of the
multiply-add, then to an integer), exact P8 = e4m3(2^t * 2^p_shift); out = (O / l) * v_descale. A kernel differs
from the model only by the order of its FP32 additions, its exp2 unit's last bit and fused multiply-adds.

Switches express the peers' numerics for comparison: block_scale=False (e = 0 for every block: P is rounded
relative to the row maximum, as AITER and FA3 do), rowsum="fp32" (l sums the unrounded FP32 probabilities, as
FA3 and AITER do), p_shift=0 (no offset, as AITER), rescale_threshold=0 (raise m at every larger tile maximum,
as FA3). FA3-like: exact, p_shift 8, block_scale False, rowsum "fp32", tau 0. The P range is guarded: P8 must
stay below e4m3's largest value 448 (code 0x7E), so p_shift (plus tau without block scaling) is bounded.

`lse_error_bound` gives the contract's bound on |lse - exact lse| per configuration (docs/design.md derives it).

Work is done tile by tile on chunks of query rows of all heads at once, so memory stays bounded (no
seqlen x seqlen tensor) while every step is a batched tensor operation.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass

import torch

FP8_DTYPE = torch.float8_e4m3fn
P_MODES = ("bf16", "lean", "exact")
ROWSUMS = ("rounded", "fp32")
KERNEL_DTYPES = {"bf16": torch.bfloat16, "fp8e4m3": FP8_DTYPE}  # manifest dtype names

LOG2E = 1.0 / math.log(2.0)
LN2 = math.log(2.0)

# Lazy-rescale thresholds tau, in binades (the contract's values per configuration).
FP8_RESCALE_THRESHOLD = 0.125
BF16_RESCALE_THRESHOLD = 0.5
BF16_WIDE_RESCALE_THRESHOLD = 8.0  # d_qk = 192: the rare rescale is worth more than the headroom
WIDE_HEAD_DIM = 192  # heads this wide use the wide tau (BF16)

FP8_P_SHIFT = 8  # P is written 2^8 larger than the probability before the FP8 rounding
DEFAULT_KEY_TILE = 128  # the sm90a kernels' tile and the reference backend's
DEFAULT_SCALE_BLOCK = 64  # keys per FP8 scaling block

# e4m3 bit patterns: the code grows by 8 per doubling (3 mantissa bits) and 56 is the code of 1.0.
E4M3_CODES_PER_BINADE = 8
E4M3_ONE_CODE = 56
E4M3_LARGEST_FINITE = 448.0  # code 0x7E
E4M3_SUBNORMAL_STEP = 2.0**-9
# P8 must stay below e4m3's largest value, where conversions saturate and would clip a row's dominant weights (FA4's
# FP8 forward had this with P offset by 8 and a lazy-rescale threshold of 4): the largest P exponent whose lean
# code and exact rounding both stay at or below code 0x7D (416).
MAX_P_EXPONENT = math.log2(E4M3_LARGEST_FINITE) - 1 / E4M3_CODES_PER_BINADE

# lse: what the model's FP32 arithmetic adds to the rounding of P (scores, sums and the lse itself rounded to
# FP32), in nats; at most 2.3e-6 measured on the cases of docs/accuracy.md.
LSE_FP32_ALLOWANCE = 1e-4

# Scores held per step (rows x keys x heads): bounds the model's memory to some tens of MiB.
SCORES_PER_STEP = 1 << 21
# Query rows per step, at most: a chunk of rows also visits the keys only its last rows see (causal waste).
MAX_ROWS_PER_STEP = 512


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class Config:
    """The resolved numerics of one call (every default filled in); checked on construction.

    BF16 configurations have block_scale False and scale_block = key_tile (their P is not block-scaled)."""

    p_mode: str
    block_scale: bool
    rowsum: str
    rescale_threshold: float
    key_tile: int
    scale_block: int
    p_shift: int

    def __post_init__(self):
        if self.p_mode not in P_MODES:
            raise ValueError(f"p_mode must be one of {P_MODES}, got {self.p_mode!r}")
        if self.rowsum not in ROWSUMS:
            raise ValueError(f"rowsum must be one of {ROWSUMS}, got {self.rowsum!r}")
        tau = self.rescale_threshold
        if not (isinstance(tau, (int, float)) and not isinstance(tau, bool) and math.isfinite(tau) and tau >= 0):
            raise ValueError(f"rescale_threshold must be a finite number >= 0, got {tau!r}")
        if not (_is_int(self.key_tile) and self.key_tile > 0):
            raise ValueError(f"key_tile must be a positive int, got {self.key_tile!r}")
        if not (_is_int(self.scale_block) and self.scale_block > 0 and self.key_tile % self.scale_block == 0):
            raise ValueError(f"scale_block must be a positive int dividing key_tile={self.key_tile}, "
                             f"got {self.scale_block!r}")
        if not isinstance(self.block_scale, bool):
            raise ValueError(f"block_scale must be True or False, got {self.block_scale!r}")
        if not (_is_int(self.p_shift) and self.p_shift >= 0):
            raise ValueError(f"p_shift must be an int >= 0, got {self.p_shift!r}")
        if not self.fp8:
            if self.p_shift or self.block_scale or self.scale_block != self.key_tile:
                raise ValueError("p_shift, block_scale and scale_block apply to FP8 probabilities: p_mode 'bf16' "
                                 f"takes p_shift=0, block_scale=False and scale_block=key_tile, got {self.p_shift}, "
                                 f"{self.block_scale}, {self.scale_block}")
            return
        # With block scaling y <= p_shift; without it a probability reaches 2^(p_shift + tau) before m is raised.
        headroom = self.p_shift + (0.0 if self.block_scale else float(tau))
        if headroom > MAX_P_EXPONENT:
            raise ValueError(f"p_shift={self.p_shift} with block_scale={self.block_scale} and rescale_threshold={tau} "
                             f"lets P8 reach 2^{headroom:g}: it must stay below e4m3's largest value 448 (code "
                             f"0x7E), so p_shift{'' if self.block_scale else ' + rescale_threshold'} must be at most "
                             f"{MAX_P_EXPONENT:.3f}")

    @property
    def fp8(self) -> bool:
        return self.p_mode != "bf16"


def fp32(x: float) -> float:
    """x rounded to the nearest FP32 value: kernels receive softmax_scale as an FP32 argument."""
    return struct.unpack("f", struct.pack("f", x))[0]


def default_p_mode(dtype: torch.dtype) -> str:
    """The contract's probability format: bf16 for BF16 inputs, exact P for FP8 (a kernel's own is in its entry)."""
    return "bf16" if dtype == torch.bfloat16 else "exact"


def default_rescale_threshold(p_mode: str, d_qk: int) -> float:
    """The contract's lazy-rescale threshold tau for a configuration."""
    if p_mode != "bf16":
        return FP8_RESCALE_THRESHOLD
    return BF16_WIDE_RESCALE_THRESHOLD if d_qk >= WIDE_HEAD_DIM else BF16_RESCALE_THRESHOLD


def default_rowsum(p_mode: str) -> str:
    """FP8 sums the rounded probabilities (weights sum to one); BF16 the FP32 ones."""
    return "fp32" if p_mode == "bf16" else "rounded"


def resolve_config(dtype: torch.dtype, d_qk: int, *, p_mode=None, block_scale=None, rowsum=None,
                   rescale_threshold=None, key_tile=None, scale_block=None, p_shift=None) -> Config:
    """The contract's numerics for (dtype, d_qk) with the given options (None: the contract's default)."""
    if dtype not in (torch.bfloat16, FP8_DTYPE):
        raise TypeError(f"inputs must be torch.bfloat16 or torch.float8_e4m3fn, got {dtype}")
    p_mode = default_p_mode(dtype) if p_mode is None else p_mode
    if p_mode not in P_MODES:
        raise ValueError(f"p_mode must be one of {P_MODES}, got {p_mode!r}")
    if (p_mode == "bf16") != (dtype == torch.bfloat16):
        raise ValueError(f"p_mode={p_mode!r} does not fit {dtype} inputs: 'bf16' is for BF16 inputs, "
                         "'lean' and 'exact' for float8_e4m3fn inputs")
    key_tile = DEFAULT_KEY_TILE if key_tile is None else key_tile
    fp8 = p_mode != "bf16"
    if not fp8:  # BF16 P is not block-scaled: the FP8 options keep their neutral values
        for name, value, neutral in (("block_scale", block_scale, False), ("p_shift", p_shift, 0),
                                     ("scale_block", scale_block, key_tile)):
            if value not in (None, neutral):
                raise ValueError(f"{name} applies to FP8 probabilities; p_mode 'bf16' takes {neutral} or None, "
                                 f"got {value!r}")
    return Config(
        p_mode=p_mode,
        block_scale=fp8 if block_scale is None else block_scale,
        rowsum=default_rowsum(p_mode) if rowsum is None else rowsum,
        rescale_threshold=default_rescale_threshold(p_mode, d_qk) if rescale_threshold is None else rescale_threshold,
        key_tile=key_tile,
        scale_block=(DEFAULT_SCALE_BLOCK if fp8 else key_tile) if scale_block is None else scale_block,
        p_shift=(FP8_P_SHIFT if fp8 else 0) if p_shift is None else p_shift,
    )


KERNEL_FIELDS = ("p_mode", "p_shift", "rescale_threshold", "rowsum", "tile_n", "scale_block")


def config_from_kernel(fields: Mapping) -> Config:
    """The numerics of a kernel from its manifest entry (or any mapping with the entry's field names).

    Maps p_mode, p_shift, rescale_threshold, rowsum, key_tile = tile_n, block_scale = (scale_block is not None)
    and scale_block = scale_block or tile_n; a "dtype" field, where present, must fit p_mode."""
    name = fields.get("name", "?") if isinstance(fields, Mapping) else "?"
    where = f"kernel entry {name!r}"
    if not isinstance(fields, Mapping):
        raise TypeError(f"fields must be a mapping (a manifest entry), got {type(fields).__name__}")
    missing = [f for f in KERNEL_FIELDS if f not in fields]
    if missing:
        raise ValueError(f"{where} lacks the numerics field(s) {', '.join(missing)}")
    tile_n, scale_block = fields["tile_n"], fields["scale_block"]
    if not (_is_int(tile_n) and tile_n > 0):
        raise ValueError(f"{where}: tile_n must be a positive int, got {tile_n!r}")
    if scale_block is not None and not (_is_int(scale_block) and scale_block > 0 and tile_n % scale_block == 0):
        raise ValueError(f"{where}: scale_block must be null or a positive int dividing tile_n={tile_n}, "
                         f"got {scale_block!r}")
    if "dtype" in fields:
        if fields["dtype"] not in KERNEL_DTYPES:
            raise ValueError(f"{where}: dtype must be one of {tuple(KERNEL_DTYPES)}, got {fields['dtype']!r}")
        if (fields["dtype"] == "bf16") != (fields["p_mode"] == "bf16"):
            raise ValueError(f"{where}: p_mode {fields['p_mode']!r} does not fit dtype {fields['dtype']!r} "
                             "('bf16' is for bf16 kernels, 'lean' and 'exact' for fp8e4m3 kernels)")
    try:
        return Config(p_mode=fields["p_mode"], block_scale=scale_block is not None, rowsum=fields["rowsum"],
                      rescale_threshold=fields["rescale_threshold"], key_tile=tile_n,
                      scale_block=scale_block or tile_n, p_shift=fields["p_shift"])
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None


def lse_error_bound(cfg: Config) -> float | None:
    """The contract's bound on |lse - exact lse| in nats for a configuration, or None where it promises none.

    The lse is the log of the row sum l, so its error is the log of l's relative error plus FP32 rounding
    (LSE_FP32_ALLOWANCE). With the FP32 row sum l has FP32 rounding only. With the rounded row sum every scale
    block's sum is within factors (lo, hi) of its exact value: a block's largest P is above 2^(p_shift - 1), so the
    at most scale_block - 1 others that are subnormal or zero in e4m3 move it by a bounded share, and the normal
    ones round within a fixed relative error (docs/design.md, "The lse bound"). FP8 without block scaling gives no
    bound: all keys of a row share one scale, so a long row can lose any share of its sum to zero."""
    if cfg.rowsum == "fp32":
        return LSE_FP32_ALLOWANCE
    if not cfg.fp8:  # bf16(p): 8 significant bits, relative error at most 2^-8 / (1 + 2^-8)
        lo, hi = 1 - 1 / 257, 1 + 1 / 257
    elif not cfg.block_scale:
        return None
    else:
        others = (cfg.scale_block - 1) / 2.0 ** (cfg.p_shift - 1)  # per unit of the block's sum
        if cfg.p_mode == "exact":
            # Normal values round within a factor 1 -+ 1/17 (a tie 17/16 * 2^k to 2^k, or just above it to 18/16);
            # subnormal and flushed ones move by at most half the subnormal step 2^-9.
            rel = 1 / 17 + others * E4M3_SUBNORMAL_STEP / 2
            lo, hi = 1 - rel, 1 + rel
        else:
            # A code is within half a code (1/16 binade) of 8y + 56; code 8k + j means (1 + j/8) 2^(k-7), which
            # exceeds the log-linear 2^(k - 7 + j/8) by at most 1.5 / sqrt(2) (j = 4). Codes below 8 (subnormals)
            # and 0 fall short of 2^y by at most 2^((0.5 - 56) / 8), the largest value that rounds to code 0.
            step = max((1 + j / 8) / 2.0 ** (j / 8) for j in range(E4M3_CODES_PER_BINADE))
            half_code = 2.0 ** (0.5 / E4M3_CODES_PER_BINADE)
            lo = 1 / half_code - others * 2.0 ** ((0.5 - E4M3_ONE_CODE) / E4M3_CODES_PER_BINADE)
            hi = step * half_code
    if lo <= 0:  # small p_shift: the subnormals of a block can outweigh its largest value
        return None
    return max(math.log(hi), -math.log(lo)) + LSE_FP32_ALLOWANCE


def attention(q, k, v, *, softmax_scale=None, q_descale=1.0, k_descale=1.0, v_descale=1.0, p_mode=None,
              block_scale=None, rowsum=None, rescale_threshold=None, key_tile=None, scale_block=None, p_shift=None,
              config: Config | None = None, return_lse=False):
    """Causal attention with the kernels' numerics.

    q: (batch, seqlen, heads, d_qk), k: (batch, seqlen, heads_k, d_qk), v: (batch, seqlen, heads_k, d_v),
    all torch.bfloat16 or all torch.float8_e4m3fn; query head h uses key/value head h // (heads / heads_k).
    softmax_scale: defaults to 1/sqrt(d_qk). Descales (FP8 only): floats or float32 tensors broadcastable to
    (batch, heads_k), the per (batch, kv head) factors that decode the stored values.
    The numerics, each None for the contract's default (see resolve_config and the module docstring):
    p_mode: "bf16" | "exact" | "lean". block_scale: per-block power-of-two scaling of FP8 probabilities (False:
    relative to the row maximum). rowsum: "rounded" (sum the probabilities that multiply V) or "fp32" (the
    unrounded ones). rescale_threshold: tau in binades. key_tile, scale_block: keys per tile and per FP8 scaling
    block. p_shift: P is written 2^p_shift larger before the FP8 rounding.
    config: a Config (e.g. config_from_kernel(manifest entry)) instead of the options above.
    Returns out (batch, seqlen, heads, d_v) BF16 and, with return_lse, lse (batch, heads, seqlen) float32.
    """
    options = {"p_mode": p_mode, "block_scale": block_scale, "rowsum": rowsum, "rescale_threshold": rescale_threshold,
               "key_tile": key_tile, "scale_block": scale_block, "p_shift": p_shift}
    batch, seqlen, heads, heads_k = _check_shapes(q, k, v)
    if config is None:
        cfg = resolve_config(q.dtype, q.shape[-1], **options)
    else:
        given = [name for name, value in options.items() if value is not None]
        if not isinstance(config, Config):
            raise TypeError(f"config must be a zyfa.numerics.Config, got {type(config).__name__}")
        if given:
            raise ValueError(f"give either config or the numerics options, not both (got config and {given})")
        if config.fp8 != (q.dtype == FP8_DTYPE):
            raise ValueError(f"config has p_mode {config.p_mode!r}, which does not fit {q.dtype} inputs")
        cfg = config
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
        # A block with no visible key for the row contributes nothing: give it e = 0 so t stays -inf, not NaN.
        e = torch.where(block_max > -math.inf, torch.floor(m[..., None] - block_max), torch.zeros_like(block_max))
    else:
        e = torch.zeros_like(block_max)
    t = (xb - m[..., None, None]) + e[..., None]  # y = t + p_shift, the offset applied exactly below
    p8 = lean_p(t, cfg.p_shift) if cfg.p_mode == "lean" else exact_p(t, cfg.p_shift)
    weight = torch.ldexp(torch.ones_like(e), -e)  # 2^-e, exact
    products = _round_to_fp32(torch.einsum("bhgrks,bhksd->bhgrkd", p8.double(), vb))
    summed = p8 if cfg.rowsum == "rounded" else _exp2(t) * 2.0**cfg.p_shift
    sums = _round_to_fp32(summed.double().sum(dim=-1))
    for b in range(blocks):
        o += weight[..., b, None] * products[..., b, :]
        l += weight[..., b] * sums[..., b]


def lean_codes(t: torch.Tensor, p_shift: int = FP8_P_SHIFT) -> torch.Tensor:
    """Lean P's e4m3 codes max(0, rne(8t + 56 + 8 p_shift)) as uint8, from FP32 t = (x - m) + e (-inf -> 0)."""
    offset = float(E4M3_ONE_CODE + E4M3_CODES_PER_BINADE * p_shift)
    codes = torch.round(t.float() * E4M3_CODES_PER_BINADE + offset).clamp_min(0)  # torch.round: half to even
    return codes.to(torch.uint8)


def lean_p(t: torch.Tensor, p_shift: int = FP8_P_SHIFT) -> torch.Tensor:
    """Lean P: the e4m3 value whose bit pattern is lean_codes(t, p_shift), as FP32."""
    return lean_codes(t, p_shift).view(FP8_DTYPE).float()


def exact_p(t: torch.Tensor, p_shift: int = FP8_P_SHIFT) -> torch.Tensor:
    """Exact P: e4m3(2^t * 2^p_shift) rounded to nearest even from FP32 (2^t rounded once to FP32), as FP32."""
    return (_exp2(t) * 2.0**p_shift).to(FP8_DTYPE).float()
