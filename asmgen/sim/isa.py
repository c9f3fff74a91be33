"""The instruction table: mnemonic -> semantics, the execution unit it occupies, and where its semantics come from.

Sources are cited as `PCODE NAME` (the CDNA ISA pseudocode entry, tinygrad.runtime.autogen.amd.cdna.str_pcode),
`gfx950.md` (our reference notes, with the facts marked there as to check) or `ISA guide` (the prose of the CDNA
ISA documents, e.g. buffer addressing).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# Execution units, used for the waitcnt counters and the hazard check.
SALU, VALU, MFMA, SMEM, LDS, VMEM_LOAD, VMEM_STORE, BRANCH, SYNC = (
    "salu", "valu", "mfma", "smem", "lds", "vmem_load", "vmem_store", "branch", "sync")


@dataclass(frozen=True)
class Semantics:
    fn: Callable
    unit: str
    source: str


INSTRUCTIONS: dict[str, Semantics] = {}


def define(names: str | list[str], unit: str, source: str) -> Callable:
    """Register `fn(wave, ins, ctx)` for each mnemonic in `names` (a string may hold several, space-separated)."""
    names = names.split() if isinstance(names, str) else names

    def register(fn: Callable) -> Callable:
        for name in names:
            if name in INSTRUCTIONS:
                raise ValueError(f"{name} defined twice")
            INSTRUCTIONS[name] = Semantics(fn, unit, source.replace("{NAME}", name.upper()))
        return fn
    return register


def table() -> list[tuple[str, str, str]]:
    """(mnemonic, unit, source) for every implemented instruction, sorted."""
    return sorted((name, s.unit, s.source) for name, s in INSTRUCTIONS.items())


# The instruction families register themselves through `define` when imported.
# (compiled_ops and mfma_bf16: the instructions clang emits for the HIP kernels of asmgen/hip.)
from . import compiled_ops, memops, mfma, mfma_bf16, salu, valu  # noqa: E402, F401
