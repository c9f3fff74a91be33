"""Kernel choice from the manifest: what zyfa supports, which p_mode a call gets and which entry runs it.

Everything here reads zyfa_kernels' manifest (plain JSON, no native code), so the CPU path uses it too: the head
dims the API accepts are those some kernel has, and a target's default p_mode is its entry marked p_mode_default.
Lookups are cached (bounded), so a call after the first of its kind costs a dict access.
"""

from __future__ import annotations

import functools

import torch

DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float8_e4m3fn: "fp8e4m3"}
FP8_P_MODES = ("exact", "lean")  # the values of the API's p_mode argument
CONTRACT_P_MODE = "exact"  # the contract's FP8 default where no kernel decides (the CPU reference path)


def manifest():
    import zyfa_kernels  # the package's manifest module is pure Python: importing it loads no extension

    return zyfa_kernels.manifest()


@functools.cache
@torch.compiler.assume_constant_result  # torch.compile calls it and traces the result, not the file read
def head_dims() -> tuple[tuple[int, int], ...]:
    """Every (d_qk, d_v) some kernel of the manifest takes, in increasing order."""
    return tuple(sorted({(k.d_qk, k.d_v) for k in manifest().kernels}))


def describe_head_dims() -> str:
    return " or ".join(f"d_qk = {dq}, d_v = {dv}" for dq, dv in head_dims())


def _candidates(target: str, dtype: str, d_qk: int, d_v: int):
    return [k for k in manifest().of(target) if (k.dtype, k.d_qk, k.d_v) == (dtype, d_qk, d_v)]


@functools.lru_cache(maxsize=64)
def p_modes(target: str, dtype: str, d_qk: int, d_v: int) -> tuple[str, ...]:
    """The p_modes `target` has kernels for, default first."""
    found = _candidates(target, dtype, d_qk, d_v)
    return tuple(sorted({k.p_mode for k in found}, key=lambda mode: not any(
        k.p_mode == mode and k.p_mode_default for k in found)))


@functools.lru_cache(maxsize=256)
def kernel(target: str, dtype: torch.dtype, d_qk: int, d_v: int, p_mode: str | None, seqlen: int,
           span_bytes: int = 0):
    """The manifest entry that runs a call on `target`: its dtype and head dims, p_mode (None: the entry marked
    p_mode_default), whose [seqlen_min, seqlen_max) holds seqlen and whose offset_bits address span_bytes (the largest
    byte offset the call needs). ValueError naming the argument when there is none."""
    name = DTYPE_NAMES[dtype]
    found = _candidates(target, name, d_qk, d_v)
    if not found:
        raise ValueError(f"{target}: no kernel for {name} inputs with head dims d_qk={d_qk}, d_v={d_v}"
                         + _listing(target))
    if p_mode is None:
        found = [k for k in found if k.p_mode_default]
    elif p_mode not in {k.p_mode for k in found}:
        raise ValueError(f"p_mode={p_mode!r}: {target} has no {name} kernel with that p_mode at d_qk={d_qk}, "
                         f"d_v={d_v}; it has {list(p_modes(target, name, d_qk, d_v))} (p_mode=None takes the "
                         f"default)")
    else:
        found = [k for k in found if k.p_mode == p_mode]
    serving = [k for k in found if k.serves(seqlen)]
    if not serving:
        raise ValueError(f"{target}: no {name} kernel at d_qk={d_qk}, d_v={d_v} serves seqlen {seqlen}"
                         + _listing(target))
    fitting = [k for k in serving if span_bytes < 2**k.offset_bits]
    if not fitting:
        raise ValueError(f"{target}: the inputs span {span_bytes} bytes, more than the {name} kernels at "
                         f"d_qk={d_qk} address ({max(k.offset_bits for k in serving)}-bit offsets)")
    if len(fitting) > 1:  # a narrower kernel is taken only where it fits: prefer the 32-bit one then
        fitting.sort(key=lambda k: k.offset_bits)
        if fitting[0].offset_bits == fitting[1].offset_bits:
            raise ValueError(f"{target}: the manifest has {len(fitting)} kernels for one call "
                             f"({', '.join(k.name for k in fitting)}): their seqlen ranges overlap")
    return fitting[0]


def _listing(target: str) -> str:
    m = manifest()
    kernels = "\n  ".join(k.variant() for k in m.of(target)) or "(none)"
    text = f"; the {target} kernels are:\n  {kernels}"
    if m.invalid:
        text += "\nentries left out as invalid:\n  " + "\n  ".join(m.invalid.values())
    return text
