"""The sm90a kernels' synchronisation (asmgen/sm90a/protocol.py): no deadlock, no load into a buffer a wgmma still
reads, every GEMM reads the tile its step needs, for every shipped configuration and a deeper ring, under random
interleavings of the producer, the consumers, the loads and the GEMMs. And the model catches broken protocols."""

from __future__ import annotations

import itertools

import pytest

from asmgen.sm90a import protocol
from zyfa.jobs import balanced_jobs, cta_tiles

CONFIGS = [protocol.Config(stages, pingpong) for stages, pingpong in itertools.product((2, 3), (True, False))]
CONFIGS += [protocol.Config(stages, pingpong, both_gemms=True)
            for stages, pingpong in itertools.product((2, 3), (True, False))]
CONFIGS += [protocol.Config(stages, k_first=True) for stages in (2, 3)]  # the BF16 kernels with kKFirst
CONFIGS += [protocol.Config(stages, k_first=True, first_pair=True) for stages in (2, 3)]  # ... and kFirstPair
# (batch, heads, heads_k, tiles, grid): few CTAs, so each walks many tiles of several jobs, with empty jobs and
# single tiles in the tail, and tiles 0 (the diagonal alone) next to long ones
TABLES = [(1, 4, 2, 6, 3), (2, 3, 3, 5, 4), (1, 8, 2, 4, 5)]


def tiles_of_every_cta(batch, heads, num_tiles, grid):
    table = balanced_jobs(batch, heads, num_tiles, grid)
    return [cta_tiles(table, cta) for cta in range(table.shape[1])]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"s{c.stages}-{'pp' if c.pingpong else 'ind'}"
                         f"{'-fp8' if c.both_gemms else ''}{'-kfirst' if c.k_first else ''}"
                         f"{'-pair' if c.first_pair else ''}")
def test_protocol_holds_under_random_interleavings(cfg):
    for batch, heads, heads_k, num_tiles, grid in TABLES:
        for tiles in tiles_of_every_cta(batch, heads, num_tiles, grid):
            for seed in range(4):
                assert protocol.run(tiles, heads // heads_k, cfg, seed) > 0


def faulty(drop):
    """consume() with the operations `drop` selects left out."""
    original = protocol.consume

    def consume(c, tiles, group, cfg):
        return (op for op in original(c, tiles, group, cfg) if not drop(op))

    return consume


@pytest.mark.parametrize("drop, message", [
    # V released before the P V that reads it has completed: the next load into the slot races the GEMM
    (lambda op: op[0] == "wait_group" and op[2] == 0, "wgmma reads it|holds"),
    # Q used without waiting for its load: the GEMM reads the previous tile's Q
    (lambda op: op[0] == "wait" and op[1].startswith("q_full"), "holds"),
    # K never released: the producer waits for ever
    (lambda op: op[0] == "arrive" and op[1].startswith("k_empty"), "deadlock"),
])
@pytest.mark.parametrize("cfg", [protocol.Config(), protocol.Config(both_gemms=True), protocol.Config(k_first=True),
                                 protocol.Config(k_first=True, first_pair=True)],
                         ids=["bf16", "fp8", "bf16-kfirst", "bf16-pair"])
def test_model_catches_broken_protocols(monkeypatch, drop, message, cfg):
    monkeypatch.setattr(protocol, "consume", faulty(drop))
    tiles = tiles_of_every_cta(1, 4, 6, 3)[0]
    with pytest.raises(protocol.ProtocolError, match=message):
        for seed in range(200):
            protocol.run(tiles, 2, cfg, seed)


def test_model_catches_a_first_pair_that_skips_key_tile_1s_k(monkeypatch):
    # kFirstPair waits for the K of key tiles 0 and 1 before the pair's turn; without the second wait the pair's
    # second QK^T may read a K slot still loading
    def waits_for_k(op):
        return op is not None and op[0] == "wait" and op[1].startswith("k_full")

    original = protocol.consume

    def without_k1_wait(*args):  # the wait for key tile 1's K: the one right after key tile 0's
        before = None
        for op in original(*args):
            if not (waits_for_k(op) and waits_for_k(before)):
                yield op
            before = op

    monkeypatch.setattr(protocol, "consume", without_k1_wait)
    tiles = tiles_of_every_cta(1, 4, 6, 3)[0]
    with pytest.raises(protocol.ProtocolError, match="holds"):
        for seed in range(200):
            protocol.run(tiles, 2, protocol.Config(k_first=True, first_pair=True), seed)
