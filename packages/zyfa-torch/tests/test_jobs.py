"""Job tables of the persistent kernels: every query tile computed once, and the balanced table's tail."""

from __future__ import annotations

import numpy as np
import pytest

from zyfa import jobs

H200_SMS = 132


def tiles_of(table: np.ndarray) -> list[tuple[int, int, int]]:
    """(batch, head, tile) of every tile the table's jobs compute, in walk order."""
    out = []
    for b, h, lo, hi in table.reshape(-1, 4):
        if lo != jobs.EMPTY:
            out += [(b, h, lo)] + ([(b, h, hi)] if hi != lo else [])
    return out


def every_tile(batch, heads, num_tiles):
    return sorted((b, h, t) for b in range(batch) for h in range(heads) for t in range(num_tiles))


@pytest.mark.parametrize("batch, heads, num_tiles, grid", [
    (1, 32, 256, H200_SMS), (1, 32, 128, H200_SMS), (2, 16, 32, H200_SMS), (3, 6, 3, H200_SMS), (1, 2, 2, H200_SMS),
    (1, 1, 1, H200_SMS), (2, 7, 9, 5), (1, 128, 16, H200_SMS),
])
def test_balanced_table_computes_every_tile_once(batch, heads, num_tiles, grid):
    table = jobs.balanced_jobs(batch, heads, num_tiles, grid)
    assert table.dtype == np.int32 and table.ndim == 3 and table.shape[2] == 4 and table.shape[1] <= grid
    assert sorted(tiles_of(table)) == every_tile(batch, heads, num_tiles)
    assert sorted(tiles_of(jobs.paired_jobs(batch, heads, num_tiles))) == every_tile(batch, heads, num_tiles)


def test_balanced_table_keeps_whole_pairs_in_order_then_deals_single_tiles():
    num_tiles = 256
    table = jobs.balanced_jobs(1, 32, num_tiles, H200_SMS)
    pairs = jobs.paired_jobs(1, 32, num_tiles)
    bulk_rounds = len(pairs) // H200_SMS - jobs.TAIL_ROUNDS
    assert np.array_equal(table[:bulk_rounds].reshape(-1, 4), pairs[:bulk_rounds * H200_SMS])
    tail = table[bulk_rounds:]
    real = tail[tail[..., 2] != jobs.EMPTY]
    assert np.array_equal(real[:, 2], real[:, 3])  # single tiles only
    assert (tail[..., 2] == jobs.EMPTY).any()  # some CTAs need fewer jobs than others
    assert np.array_equal(jobs.balanced_jobs(1, 32, num_tiles, H200_SMS), table)  # deterministic


@pytest.mark.parametrize("seqlen, heads, before, after", [
    # protocol shapes on 132 SMs: key tiles of the busiest CTA, paired (whole rounds) and balanced
    (2048, 128, 136, 133), (8192, 32, 520, 508), (16384, 32, 2064, 2012), (32768, 32, 8224, 7980),
])
def test_balanced_table_shortens_the_tail(seqlen, heads, before, after):
    num_tiles = seqlen // 128
    table = jobs.balanced_jobs(1, heads, num_tiles, H200_SMS)
    paired = jobs.in_rounds(jobs.paired_jobs(1, heads, num_tiles), H200_SMS)
    assert jobs.makespan(paired) == before
    assert jobs.makespan(table) == after
    lower_bound = -(-heads * num_tiles * (num_tiles + 1) // 2 // H200_SMS)
    assert lower_bound <= after <= lower_bound + num_tiles // 8


def test_small_problems_spread_single_tiles_over_fewer_ctas():
    table = jobs.balanced_jobs(1, 2, 4, H200_SMS)  # 8 tiles: one per CTA, largest first
    assert table.shape == (1, 8, 4)
    assert table[0, :, 2].tolist() == [3, 3, 2, 2, 1, 1, 0, 0]


def test_in_rounds_lays_out_the_kernels_round_robin_walk():
    pairs = jobs.paired_jobs(1, 3, 4)  # 6 pairs
    table = jobs.in_rounds(pairs, 4)
    assert table.shape == (2, 4, 4) and np.array_equal(table.reshape(-1, 4)[:6], pairs)
    assert (table[1, 2:, 2] == jobs.EMPTY).all()
    assert jobs.in_rounds(pairs, 132).shape == (1, 6, 4)  # never more CTAs than jobs
    assert jobs.cta_tiles(table, 1) == [(0, 0, 1), (0, 0, 2), (0, 2, 1), (0, 2, 2)]
    assert jobs.cta_tiles(table, 3) == [(0, 1, 1), (0, 1, 2)]  # then an empty job
