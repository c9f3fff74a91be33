"""Assembly text builder: named sections, comments, labels, and automatic hazard padding.

The emitter counts wait states the way LLVM's hazard recognizer does (one per issued instruction, N+1 per
`s_nop N`) and inserts the s_nop padding that the rules of `hazards` require before an instruction reads a
VGPR whose producer is still within its hazard window. `hazards.check` re-verifies the finished text independently.
"""

from __future__ import annotations

from . import hazards

BRANCHES = ("s_branch", "s_cbranch_scc0", "s_cbranch_scc1", "s_cbranch_vccz", "s_cbranch_vccnz",
            "s_cbranch_execz", "s_cbranch_execnz", "s_endpgm")


class Emitter:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self._tracker = hazards.Tracker()

    def section(self, title: str) -> None:
        self.lines += ["", f"  // ==== {title} " + "=" * max(0, 100 - len(title))]

    def comment(self, text: str) -> None:
        self.lines.append(f"  // {text}")

    def label(self, name: str) -> None:
        # Control flow joins here: forget the producers, and pad so any path arrives hazard-free.
        self._pad_all()
        self.lines.append(f"{name}:")

    def raw(self, text: str) -> None:
        self.lines.append(text)

    def op(self, mnemonic: str, *operands: object, mods: str = "", note: str = "") -> None:
        text = mnemonic + (" " + ", ".join(str(o) for o in operands) if operands else "")
        if mods:
            text += " " + mods
        if mnemonic in BRANCHES:
            self._pad_all()  # the target and the fall-through both start hazard-free
        for nops in self._tracker.padding_before(text):
            self.lines.append(f"  s_nop {nops - 1}")
            self._tracker.issue(f"s_nop {nops - 1}")
        self._tracker.issue(text)
        self.lines.append(f"  {text:<72} // {note}" if note else f"  {text}")

    def _pad_all(self) -> None:
        nops = self._tracker.drain()
        while nops > 0:
            n = min(nops, hazards.MAX_NOP)
            self.lines.append(f"  s_nop {n - 1}")
            nops -= n
        self._tracker = hazards.Tracker()

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"
