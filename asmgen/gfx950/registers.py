"""The one register allocation table of a kernel: named, non-overlapping ranges of SGPRs and VGPRs.

Ranges that are live in different phases of the key loop may share registers; such a range is declared with
`alias_of` (and must fit inside the range it reuses), so an overlap is always a stated decision, never an accident.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RegRange:
    name: str
    file: str  # "s" or "v"
    first: int
    count: int
    purpose: str
    alias_of: str | None = None

    @property
    def last(self) -> int:
        return self.first + self.count - 1

    def __getitem__(self, i: int) -> str:
        if not 0 <= i < self.count:
            raise IndexError(f"{self.name}[{i}] outside its {self.count} registers")
        return f"{self.file}{self.first + i}"

    def span(self, start: int, count: int) -> str:
        """Operand text for `count` registers starting at element `start`, e.g. v[8:15]."""
        if start < 0 or start + count > self.count:
            raise IndexError(f"{self.name}[{start}:{start + count}] outside its {self.count} registers")
        lo = self.first + start
        return f"{self.file}{lo}" if count == 1 else f"{self.file}[{lo}:{lo + count - 1}]"

    @property
    def all(self) -> str:
        return self.span(0, self.count)

    def __str__(self) -> str:
        return self[0] if self.count == 1 else self.all


class RegisterTable:
    """Allocates registers in declaration order; alignment is per request (SGPR tuples and MFMA operands)."""

    def __init__(self) -> None:
        self.ranges: dict[str, RegRange] = {}
        self._next = {"s": 0, "v": 0}

    def fixed(self, name: str, file: str, first: int, count: int, purpose: str) -> RegRange:
        """A range placed by the hardware (kernarg pointer, workgroup id, workitem id)."""
        rng = RegRange(name, file, first, count, purpose)
        self._add(rng)
        self._next[file] = max(self._next[file], first + count)
        return rng

    def alloc(self, name: str, file: str, count: int, purpose: str, align: int = 1) -> RegRange:
        first = -(-self._next[file] // align) * align
        rng = RegRange(name, file, first, count, purpose)
        self._add(rng)
        self._next[file] = first + count
        return rng

    def alias(self, name: str, base: RegRange, start: int, count: int, purpose: str) -> RegRange:
        if start < 0 or start + count > base.count:
            raise ValueError(f"alias {name} does not fit in {base.name}")
        rng = RegRange(name, base.file, base.first + start, count, purpose, alias_of=base.name)
        self._add(rng)
        return rng

    def _add(self, rng: RegRange) -> None:
        if rng.name in self.ranges:
            raise ValueError(f"register range {rng.name} declared twice")
        self.ranges[rng.name] = rng

    def count(self, file: str) -> int:
        return max((r.last + 1 for r in self.ranges.values() if r.file == file), default=0)

    def overlaps(self) -> list[tuple[str, str]]:
        """Pairs of ranges that share registers without one being declared an alias of the other."""
        found = []
        items = list(self.ranges.values())
        for i, a in enumerate(items):
            for b in items[i + 1:]:
                if a.file != b.file or a.last < b.first or b.last < a.first:
                    continue
                if a.alias_of == b.name or b.alias_of == a.name or (a.alias_of and a.alias_of == b.alias_of):
                    continue
                found.append((a.name, b.name))
        return found

    def comment_block(self) -> list[str]:
        lines = ["register allocation:"]
        for r in sorted(self.ranges.values(), key=lambda r: (r.file, r.first, r.name)):
            where = r.span(0, r.count)
            alias = f" (reuses {r.alias_of})" if r.alias_of else ""
            lines.append(f"  {where:<12} {r.name:<14} {r.purpose}{alias}")
        return lines
