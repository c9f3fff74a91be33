"""Job tables for the persistent kernels.

A job is one (batch, head, pair of query tiles): tile t is paired with tile T-1-t so that every job covers
T+1 key tiles of causal work (for odd T the middle tile is a job of its own, with half the work). Jobs are
rows of int32 [batch, head, tile_lo, tile_hi]; a workgroup w of a grid of G walks rows w, w+G, w+2G, ...
Each output tile belongs to exactly one job, so results do not depend on the grid size or the timing.
"""

from __future__ import annotations

import numpy as np

JOB_FIELDS = ("batch", "head", "tile_lo", "tile_hi")


def paired_jobs(batch: int, heads: int, num_tiles: int) -> np.ndarray:
    """All jobs, head-major: consecutive jobs share a head (and so K and V in L2)."""
    lo = np.arange((num_tiles + 1) // 2, dtype=np.int32)
    pairs = np.stack([lo, num_tiles - 1 - lo], axis=1)
    bh = np.stack(np.meshgrid(np.arange(batch), np.arange(heads), indexing="ij"), -1).reshape(-1, 2)
    jobs = np.concatenate([np.repeat(bh, len(pairs), axis=0), np.tile(pairs, (len(bh), 1))], axis=1)
    return np.ascontiguousarray(jobs, dtype=np.int32)


def chiplet_order(jobs: np.ndarray, grid: int, chiplets: int) -> np.ndarray:
    """Reorder jobs so that each chiplet takes consecutive jobs of the list.

    Workgroup w runs on chiplet w % chiplets and takes slots w, w+grid, ...; slot s therefore runs on chiplet
    (s % grid) % chiplets. This fills the slots of chiplet 0 with the first jobs in order, then chiplet 1, ...,
    so consecutive pairs of one head meet in one chiplet's L2.
    """
    n = len(jobs)
    slots = np.arange(n)
    chip = (slots % grid) % chiplets
    order = np.argsort(chip, kind="stable")  # slots grouped by chiplet, in walk order within each
    out = np.empty_like(jobs)
    out[order] = jobs
    return out
