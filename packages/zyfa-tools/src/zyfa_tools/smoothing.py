"""K smoothing: subtract each KV head's mean key before quantizing k.

q . (k_j - mu) = q . k_j - q . mu: the second term is the same for every key of a query row, so the softmax
does not change as long as every key of the row uses the same mu. Real keys carry a large common offset (a
per-channel bias); without it, k's FP8 scale covers only the varying part and keeps more of its precision.
A mean fixed in advance (from calibration) keeps the equality exact for chunked prefill and prefix caching,
where one row's keys come from several calls.
"""

from __future__ import annotations

import torch


def smooth_keys(k: torch.Tensor, mean: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (k - mean, mean) for k (batch, seqlen, heads_k, d).

    mean=None: each (batch, kv head)'s mean key over the sequence, float32 (float64 for a float64 k), shaped
    (batch, 1, heads_k, d). A given mean (a float tensor of shape (heads_k, d), from calibration, or (batch, 1,
    heads_k, d)) is used as is and returned unchanged. The difference is formed in float32 (or float64) and
    returned in k's dtype.
    """
    if not isinstance(k, torch.Tensor):
        raise TypeError(f"k must be a torch.Tensor, got {type(k).__name__}")
    if k.dim() != 4:
        raise ValueError(f"k has {k.dim()} dimensions, expected 4 (batch, seqlen, heads_k, d)")
    if not k.dtype.is_floating_point or k.dtype == torch.float8_e4m3fn:
        raise TypeError(f"k has dtype {k.dtype}: smooth keys before quantizing them (a BF16 or float k)")
    work = torch.promote_types(k.dtype, torch.float32)  # float32, or float64 for a float64 k
    if mean is None:
        mean = k.to(work).mean(dim=1, keepdim=True)
    elif not isinstance(mean, torch.Tensor):
        raise TypeError(f"mean must be a torch.Tensor or None, got {type(mean).__name__}")
    else:
        batch, _, heads_k, d = k.shape
        if mean.shape[-2:] != (heads_k, d) or (mean.dim() == 4 and mean.shape[1] != 1) or mean.dim() not in (2, 4):
            raise ValueError(
                f"mean has shape {tuple(mean.shape)}: expected (heads_k, d) = {(heads_k, d)} or "
                f"(batch, 1, heads_k, d), one mean key per KV head for the whole sequence"
            )
        if mean.device != k.device:
            raise ValueError(f"mean is on {mean.device} but k is on {k.device}")
    return (k.to(work) - mean).to(k.dtype), mean
