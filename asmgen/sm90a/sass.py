"""SASS of the sm90a cubins, read the way docs/sm90a.md discusses it: the key-tile steps.

In the BF16 kernels every wait for S (`WARPGROUP.DEPBAR.LE gsb0, 0x1`, QK^T done while P V may still run) opens a
step, which runs to its P V wait (`gsb0, 0x0`). What lies between the two runs under P V; what follows the P V wait
up to the next GEMM issue is exposed. The FP8 kernels wait for both GEMMs of a step at once: a step is a wait for no
group (`gsb0, 0x0`) after an issue of two commit groups (QK^T and P V), and all of it is exposed (the other
consumer's GEMMs are what run under it). A report row gives the instructions (NOPs left out) and exponentials
(MUFU.EX2) under P V, where the barrier arrives stand among them (K slot and Q releases), and the exposed
instructions and exponentials, counted in address order up to the next HGMMA/QGMMA or S wait. Steps in address
order: the steady step, then the diagonal step. Per cubin the report also counts the instructions of a query tile's
epilogue from its last P V's wait to O's last store (`epilogue`).
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from . import cuobjdump

OBJECTS = Path(__file__).resolve().parents[2] / "packages/zyfa-kernels/src/zyfa_kernels/objects/sm90a"
_INSTRUCTION = re.compile(r"/\*[0-9a-f]{4,}\*/\s+([^;]*);")  # addresses past 64 KiB have more digits
_ADDRESSED = re.compile(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);")
_FUNCTION = re.compile(r"\n\s*Function : (\S+)")
LOCAL_MEMORY = re.compile(r"\b(LDL|STL)\b")
S_WAIT = "WARPGROUP.DEPBAR.LE gsb0, 0x1"
PV_WAIT = "WARPGROUP.DEPBAR.LE gsb0, 0x0"
_O_STORE = re.compile(r"STG\.E\.128|UBLKCP|UTMASTG")  # O's 16-byte stores (staged), bulk copies or tensor stores
BRANCH = re.compile(r"\bBRA\b[^;]*?0x([0-9a-f]+)")  # a branch and its target address, as cuobjdump and ncu print it


def _is_gemm(text: str) -> bool:
    """A wgmma: HGMMA (BF16 operands) or QGMMA (FP8)."""
    return "HGMMA" in text or "QGMMA" in text


def _dump(cubin: Path) -> str:
    return subprocess.run([cuobjdump(), "--dump-sass", str(cubin)], capture_output=True, text=True, check=True).stdout


def instructions(cubin: Path) -> list[str]:
    """The SASS instructions of a cubin, in address order, predicates kept."""
    return [match.strip() for match in _INSTRUCTION.findall(_dump(cubin))]


def functions(cubin: Path) -> dict[str, list[tuple[int, str]]]:
    """Per kernel of a cubin, its (address, instruction) pairs in address order, predicates kept."""
    parts = _FUNCTION.split(_dump(cubin))
    return {name: [(int(address, 16), text.strip()) for address, text in _ADDRESSED.findall(body)]
            for name, body in zip(parts[1::2], parts[2::2], strict=True)}


@dataclass(frozen=True)
class Step:
    under_pv: int  # instructions between the S wait and the P V wait
    exponentials: int  # MUFU.EX2 among them
    arrives: tuple[int, ...]  # positions of barrier arrives among them
    exposed: int  # instructions after the P V wait up to the next GEMM issue or S wait, in address order
    exposed_exponentials: int  # MUFU.EX2 among those


def _exposed(code: list[str], wait: int) -> tuple[int, int]:
    """(instructions, MUFU.EX2) after the wait at `wait` up to the next GEMM issue or S wait, NOPs left out."""
    after = wait + 1
    while after < len(code) and not _is_gemm(code[after]) and S_WAIT not in code[after]:
        after += 1
    body = [c for c in code[wait + 1:after] if not c.startswith("NOP")]
    return len(body), sum("MUFU.EX2" in c for c in body)


def steps(code: list[str]) -> list[Step]:
    out = []
    for start, text in enumerate(code):
        if S_WAIT not in text:
            continue
        end = next((i for i in range(start + 1, len(code)) if PV_WAIT in code[i]), len(code))
        body = [c for c in code[start + 1:end] if not c.startswith("NOP")]
        exposed, exposed_exponentials = _exposed(code, end)
        out.append(Step(under_pv=len(body), exponentials=sum("MUFU.EX2" in c for c in body),
                        arrives=tuple(i for i, c in enumerate(body) if "SYNCS.ARRIVE" in c), exposed=exposed,
                        exposed_exponentials=exposed_exponentials))
    if out:
        return out
    # waits for both GEMMs (FP8): the P V waits whose issue since the previous wait committed two groups
    previous = 0
    for end, text in enumerate(code):
        if PV_WAIT not in text:
            continue
        if sum(_is_gemm(c) and "gsb0" in c for c in code[previous:end]) >= 2:
            exposed, exposed_exponentials = _exposed(code, end)
            out.append(Step(under_pv=0, exponentials=0, arrives=(), exposed=exposed,
                            exposed_exponentials=exposed_exponentials))
        previous = end
    return out


def serialised(code: list[str]) -> bool:
    """Whether ptxas issued each wgmma alone (a wait for it before the next, `WARPGROUP.DEPBAR` between every two):
    what it does to a whole kernel, with only a note under `ptxas -v`, when it cannot keep a wgmma pipeline (a stage
    whose accumulators other instructions define, too few registers, a call inside a stage)."""
    gemms = [i for i, c in enumerate(code) if _is_gemm(c)]
    return len(gemms) > 1 and all(any("WARPGROUP.DEPBAR" in c for c in code[a + 1:b])
                                  for a, b in zip(gemms, gemms[1:], strict=False))


def epilogue(code: list[str]) -> list[str]:
    """A query tile's epilogue after its last P V: from the P V wait before O's first `stmatrix` (the staged,
    bulk-copy and tensor stores) to O's last 16-byte store, bulk copy or tensor store, NOPs left out; empty for a cubin
    without stmatrix or without a P V wait before it (O stored under the next QK^T)."""
    first = next((i for i, c in enumerate(code) if c.startswith("STSM")), None)
    if first is None:
        return []
    start = max((i for i in range(first) if PV_WAIT in code[i]), default=None)
    if start is None:
        return []
    end = max(i for i, c in enumerate(code) if _O_STORE.search(c))
    return [c for c in code[start:end + 1] if not c.startswith("NOP")]


def report(cubins: list[Path]) -> str:
    rows = ["| cubin | wgmma | MUFU.EX2 | local memory ops | epilogue | step | under P V (MUFU.EX2) | arrives at | "
            "exposed (MUFU.EX2) |", "|---|---|---|---|---|---|---|---|---|"]
    for cubin in cubins:
        code = instructions(cubin)
        local = sum(bool(LOCAL_MEMORY.search(c)) for c in code)
        gemms, exponentials = sum(map(_is_gemm, code)), sum("MUFU.EX2" in c for c in code)
        totals = f"{gemms} | {exponentials} | {local} | {len(epilogue(code)) or '-'}"
        for index, step in enumerate(steps(code)):
            head = f"| {cubin.stem} | {totals}" if index == 0 else "| | | | |"
            rows.append(f"{head} | {index + 1} | {step.under_pv} ({step.exponentials}) | "
                        f"{', '.join(map(str, step.arrives)) or '-'} | {step.exposed} ({step.exposed_exponentials}) |")
    return "\n".join(rows)
