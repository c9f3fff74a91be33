"""Job tables for the persistent kernels.

A job is one (batch, head, pair of query tiles): tile t is paired with tile T-1-t so that every job covers
T+1 key tiles of causal work (for odd T the middle tile is a job of its own, with half the work). Jobs are
rows of int32 [batch, head, tile_lo, tile_hi]; a workgroup w of a grid of G walks rows w, w+G, w+2G, ...
A job of one tile has tile_lo == tile_hi; an empty job (a slot that a workgroup skips) has tile_lo < 0.
Each output tile belongs to exactly one job, so results do not depend on the grid size or the timing.
"""

from __future__ import annotations

import heapq

import numpy as np

JOB_FIELDS = ("batch", "head", "tile_lo", "tile_hi")
EMPTY = -1  # tile_lo of an empty job
TAIL_ROUNDS = 2  # the pairs beyond this many rounds before the end are dealt as single tiles (balanced_jobs)


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


def balanced_jobs(batch: int, heads: int, num_tiles: int, grid: int) -> np.ndarray:
    """Jobs for a persistent grid, as an array (rounds, width, 4): row r, column w is workgroup w's r-th job.

    Whole pairs of paired_jobs fill the rounds but the last TAIL_ROUNDS and a fraction, in order (consecutive
    workgroups share a head). Pairs alone leave the grid idle for the rest of the last round when they do not divide
    evenly (nearly a whole round at 31.03 rounds: 3% of the time); so the remaining pairs are split into single
    tiles (work t + 1 key tiles for tile t) and dealt largest first to the least-loaded workgroup, and workgroups
    that end up with fewer jobs get empty ones. width = grid, or the number of single tiles when that is smaller.
    """
    pairs = paired_jobs(batch, heads, num_tiles)
    full_rounds = max(len(pairs) // grid - TAIL_ROUNDS, 0)
    bulk = pairs[:full_rounds * grid]
    rest = pairs[full_rounds * grid:]
    singles = np.concatenate([rest[:, [0, 1, 2, 2]], rest[rest[:, 2] != rest[:, 3]][:, [0, 1, 3, 3]]])
    width = grid if full_rounds else min(grid, len(singles))
    work = singles[:, 2].astype(np.int64) + 1
    loads = [(0, w) for w in range(width)]  # (key tiles so far, workgroup): ties go to the lowest index
    dealt: list[list[int]] = [[] for _ in range(width)]
    for i in np.argsort(-work, kind="stable"):
        load, w = heapq.heappop(loads)
        dealt[w].append(i)
        heapq.heappush(loads, (load + int(work[i]), w))
    tail = np.full((max(map(len, dealt)), width, 4), EMPTY, dtype=np.int32)
    for w, rows in enumerate(dealt):
        tail[:len(rows), w] = singles[rows]
    return np.ascontiguousarray(np.concatenate([bulk.reshape(full_rounds, width, 4), tail]), dtype=np.int32)


def in_rounds(rows: np.ndarray, grid: int) -> np.ndarray:
    """Jobs as the kernels walk them, (rounds, width, 4) with width = min(grid, jobs): row r, column w is the job
    workgroup w takes r-th; the last round is padded with empty jobs."""
    width = max(min(grid, len(rows)), 1)
    table = np.full((-(-len(rows) // width) * width, 4), EMPTY, dtype=np.int32)
    table[:len(rows)] = rows
    return table.reshape(-1, width, 4)


def cta_tiles(table: np.ndarray, cta: int) -> list[tuple[int, int, int]]:
    """(batch, head, tile) in the order workgroup `cta` computes them from a (rounds, width, 4) table."""
    out = []
    for b, h, lo, hi in table[:, cta]:
        if lo != EMPTY:
            out += [(int(b), int(h), int(lo))] + ([(int(b), int(h), int(hi))] if hi != lo else [])
    return out


def makespan(table: np.ndarray) -> int:
    """Key tiles of the busiest workgroup of a (rounds, width, 4) table: the time model of the tail."""
    lo, hi = table[..., 2], table[..., 3]
    work = np.where(lo < 0, 0, lo + 1 + np.where(hi != lo, hi + 1, 0))
    return int(work.sum(axis=0).max())
