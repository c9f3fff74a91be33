"""A model of the sm90a kernels' synchronisation, run under random interleavings to look for deadlocks and hazards.

The producer and the two consumer warpgroups of one CTA (its tiles from zyfa.jobs.cta_tiles) are generators that
issue, in the order of the kernel's code, the operations that order them: mbarrier waits (by parity, as the kernel
does) and arrives, TMA loads that land at a time of the scheduler's choosing and then complete their "full" barrier,
wgmma groups that read shared memory until they complete (in issue order, at times of the scheduler's choosing),
`wgmma.wait_group`, and the ping-pong turns. Every buffer holds a label of what was loaded into it. `run` fails on:

- a deadlock (nobody can move, nothing is in flight),
- a load into a buffer that a pending wgmma group still reads (the write-after-read hazard the "empty" barriers
  prevent),
- a wgmma group that reads another tile than the one its step needs (checked when it is issued and when it
  completes),
- a parity wait that falls two phases behind its barrier (parity could no longer tell the phases apart).

It mirrors the code by hand: `produce` follows producer.cuh, `consume` mainloop_bf16.cuh (and, with `both_gemms`,
mainloop_fp8.cuh), and their options (the ring's stages, the PingPong schedule's turns) the Config fields; they
must be kept in step with it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

WARPS_PER_CONSUMER = 4  # each consumer warpgroup's release is one arrive per warp
CONSUMERS = 2


class ProtocolError(AssertionError):
    pass


@dataclass
class Barrier:
    count: int  # arrivals per phase (full barriers: completed by the landing load instead)
    phases: int = 0  # completed phases
    pending: int = 0

    def arrive(self, n: int = 1) -> None:
        self.pending += n
        if self.pending == self.count:
            self.pending, self.phases = 0, self.phases + 1
        elif self.pending > self.count:
            raise ProtocolError("more arrivals than a phase takes")


@dataclass
class Config:
    stages: int = 2
    pingpong: bool = True
    both_gemms: bool = False  # the FP8 main loop: each step waits for QK^T and P V together
    k_first: bool = False  # kKFirst: the producer loads a query tile's first K before its Q
    first_pair: bool = False  # kFirstPair: key tiles 0 and 1's QK^T in one turn from query tile 1 on


@dataclass
class Group:
    reads: list[tuple[str, int, tuple]]  # (buffer, slot, the label the step needs)


@dataclass
class State:
    cfg: Config
    barriers: dict[str, Barrier] = field(default_factory=dict)
    buffers: dict[tuple[str, int], tuple] = field(default_factory=dict)
    landings: list[tuple[str, int, tuple, str]] = field(default_factory=list)  # loads in flight
    groups: dict[int, list[Group]] = field(default_factory=lambda: {0: [], 1: []})
    turns: list[int] = field(default_factory=lambda: [0, 0])

    def __post_init__(self):
        arrivals = WARPS_PER_CONSUMER * CONSUMERS
        self.barriers["q_full"], self.barriers["q_empty"] = Barrier(1), Barrier(arrivals)
        for s in range(self.cfg.stages):
            for name in ("k_full", "v_full"):
                self.barriers[f"{name}{s}"] = Barrier(1)
            for name in ("k_empty", "v_empty"):
                self.barriers[f"{name}{s}"] = Barrier(arrivals)


class Ring:
    def __init__(self, stages: int):
        self.stages, self.slot, self.parity = stages, 0, 0

    def advance(self) -> None:
        self.slot += 1
        if self.slot == self.stages:
            self.slot, self.parity = 0, self.parity ^ 1

    def copy(self) -> Ring:
        other = Ring(self.stages)
        other.slot, other.parity = self.slot, self.parity
        return other


# Operations the agents yield: ("wait", barrier, parity, phase it waits for), ("arrive", barrier, n),
# ("load", buffer, slot, label, barrier), ("issue", consumer, [reads]), ("wait_group", consumer, n),
# ("acquire", consumer), ("release", consumer).


def produce(tiles, group: int, stages: int, k_first: bool = False):
    ring, uses = Ring(stages), [0] * stages
    for q_uses, (b, h, tile) in enumerate(tiles):
        if k_first:
            yield "wait", f"k_empty{ring.slot}", ring.parity ^ 1, uses[ring.slot]
            yield "load", "K", ring.slot, ("K", b, h // group, 0), f"k_full{ring.slot}"
        yield "wait", "q_empty", q_uses % 2 ^ 1, q_uses
        yield "load", "Q", 0, ("Q", b, h, tile), "q_full"
        for kt in range(tile + 1):
            if not (k_first and kt == 0):
                yield "wait", f"k_empty{ring.slot}", ring.parity ^ 1, uses[ring.slot]
                yield "load", "K", ring.slot, ("K", b, h // group, kt), f"k_full{ring.slot}"
            yield "wait", f"v_empty{ring.slot}", ring.parity ^ 1, uses[ring.slot]
            yield "load", "V", ring.slot, ("V", b, h // group, kt), f"v_full{ring.slot}"
            uses[ring.slot] += 1
            ring.advance()


def free(barrier: str):
    """A consumer warpgroup releasing a buffer: one arrive per warp on its "empty" barrier."""
    return "arrive", barrier, WARPS_PER_CONSUMER


def consume(c: int, tiles, group: int, cfg: Config):
    ring, prev = Ring(cfg.stages), None
    k_uses, v_uses = [0] * cfg.stages, [0] * cfg.stages

    def full_wait(kind: str, at: Ring, uses: list[int]):
        op = ("wait", f"{kind}_full{at.slot}", at.parity, uses[at.slot] + 1)
        uses[at.slot] += 1
        return op

    def turn(reads):
        if cfg.pingpong:
            yield "acquire", c
        yield "issue", c, reads
        if cfg.pingpong:
            yield "release", c

    if cfg.pingpong and c == 1:
        yield "release", c  # the first consumer goes first
    for q_uses, (b, h, tile) in enumerate(tiles):
        kv = (b, h // group)
        yield "wait", "q_full", q_uses % 2, q_uses + 1
        first = 1
        if cfg.first_pair and tile > 0:  # QK^T of key tiles 0 and 1 in one turn, then P V of tile 0 in another
            nxt = ring.copy()
            nxt.advance()
            yield full_wait("k", ring, k_uses)
            yield full_wait("k", nxt, k_uses)
            yield from turn([[("Q", 0, ("Q", b, h, tile)), ("K", ring.slot, ("K", *kv, 0))],
                             [("Q", 0, ("Q", b, h, tile)), ("K", nxt.slot, ("K", *kv, 1))]])
            yield "wait_group", c, 1
            yield free(f"k_empty{ring.slot}")
            yield "wait_group", c, 0
            yield free(f"k_empty{nxt.slot}")
            yield full_wait("v", ring, v_uses)
            yield from turn([[("V", ring.slot, ("V", *kv, 0))]])
            if tile == 1:
                yield free("q_empty")
            yield "wait_group", c, 0
            yield free(f"v_empty{ring.slot}")
            prev, ring, first = nxt.copy(), nxt, 2
        else:
            yield full_wait("k", ring, k_uses)
            yield from turn([[("Q", 0, ("Q", b, h, tile)), ("K", ring.slot, ("K", *kv, 0))]])
            yield "wait_group", c, 0
            yield free(f"k_empty{ring.slot}")
            if tile == 0:
                yield free("q_empty")
            prev = ring.copy()
        ring.advance()
        for kt in range(first, tile + 1):
            yield full_wait("k", ring, k_uses)
            yield full_wait("v", prev, v_uses)
            yield from turn([[("Q", 0, ("Q", b, h, tile)), ("K", ring.slot, ("K", *kv, kt))],
                             [("V", prev.slot, ("V", *kv, kt - 1))]])
            if cfg.both_gemms:  # FP8: both GEMMs done, then V, K and (diagonal) Q released
                yield "wait_group", c, 0
                yield free(f"v_empty{prev.slot}")
                yield free(f"k_empty{ring.slot}")
                if kt == tile:
                    yield free("q_empty")
            else:  # BF16: the softmax between the S wait and the P V wait
                yield "wait_group", c, 1
                yield free(f"k_empty{ring.slot}")
                if kt == tile:
                    yield free("q_empty")
                yield "wait_group", c, 0
                yield free(f"v_empty{prev.slot}")
            prev = ring.copy()
            ring.advance()
        yield full_wait("v", prev, v_uses)
        yield from turn([[("V", prev.slot, ("V", *kv, tile))]])
        yield "wait_group", c, 0
        yield free(f"v_empty{prev.slot}")


def run(tiles, group: int, cfg: Config, seed: int) -> int:
    """One random interleaving of a CTA's producer and consumers over `tiles`; returns the number of steps."""
    rng = random.Random(seed)
    st = State(cfg)
    agents = {"producer": produce(tiles, group, cfg.stages, cfg.k_first), 0: consume(0, tiles, group, cfg),
              1: consume(1, tiles, group, cfg)}
    pending = {name: next(agent, None) for name, agent in agents.items()}
    steps = 0

    def check_reads(group_reads, when):
        for buffer, slot, label in group_reads:
            if st.buffers.get((buffer, slot)) != label:
                raise ProtocolError(f"{when}: {buffer}[{slot}] holds {st.buffers.get((buffer, slot))}, not {label}")

    def ready(op) -> bool:
        kind = op[0]
        if kind == "wait":
            _, name, parity, phase = op
            bar = st.barriers[name]
            if bar.phases > phase:
                raise ProtocolError(f"{name}: {bar.phases} phases done, a waiter needs phase {phase}: parity aliases")
            return bar.phases % 2 != parity
        if kind == "wait_group":
            return len(st.groups[op[1]]) <= op[2]
        if kind == "acquire":
            return st.turns[op[1]] > 0
        return True

    while True:
        movable = [name for name, op in pending.items() if op is not None and ready(op)]
        events = [("land", i) for i in range(len(st.landings))] + [("complete", c) for c in (0, 1) if st.groups[c]]
        choices = [("agent", name) for name in movable] + events
        if not choices:
            if any(op is not None for op in pending.values()):
                raise ProtocolError(f"deadlock: {pending}")
            return steps
        kind, which = rng.choice(choices)
        steps += 1
        if kind == "land":
            buffer, slot, label, bar = st.landings.pop(which)
            for c in (0, 1):
                if any((buffer, slot) == (b, s) for g in st.groups[c] for b, s, _ in g.reads):
                    raise ProtocolError(f"load into {buffer}[{slot}] while consumer {c}'s wgmma reads it")
            st.buffers[(buffer, slot)] = label
            st.barriers[bar].phases += 1
            continue
        if kind == "complete":
            check_reads(st.groups[which].pop(0).reads, f"consumer {which} at completion")
            continue
        op = pending[which]
        if op[0] == "arrive":
            st.barriers[op[1]].arrive(op[2])
        elif op[0] == "load":
            _, buffer, slot, label, bar = op
            st.landings.append((buffer, slot, label, bar))
        elif op[0] == "issue":
            for reads in op[2]:
                check_reads(reads, f"consumer {op[1]} at issue")
                st.groups[op[1]].append(Group(reads))
        elif op[0] == "acquire":
            st.turns[op[1]] -= 1
        elif op[0] == "release":
            st.turns[op[1] ^ 1] += 1
            if st.turns[op[1] ^ 1] > 1:  # a named barrier holds one arrival of the partner, not a count
                raise ProtocolError(f"consumer {op[1]} released its partner's turn twice")
        pending[which] = next(agents[which], None)
