"""The support matrix is generated from the manifest: every kernel appears once, defaults and ranges as recorded."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import zyfa_kernels
from zyfa_tools import support


def kernel(name, target, dtype, p_mode, **extra):
    fields = {"name": name, "target": target, "dtype": dtype, "d_qk": 128, "d_v": 128, "p_mode": p_mode, **extra}
    return SimpleNamespace(**fields, fields=fields)


def test_every_kernel_of_the_manifest_appears_once():
    table = support.markdown(support.matrix())
    for k in zyfa_kernels.manifest().kernels:
        assert len(re.findall(rf"(?<!\w){re.escape(k.name)}(?!\w)", table)) == 1, k.name
    assert len(table.splitlines()) == 2 + len({(k.target, k.dtype, k.d_qk, k.d_v, k.p_mode)
                                               for k in zyfa_kernels.manifest().kernels})


def test_defaults_ranges_and_verification_come_from_the_entries():
    fake = SimpleNamespace(kernels=[
        kernel("a", "sm90a", "fp8e4m3", "exact", p_mode_default=True, seqlen_min=None, seqlen_max=4096),
        kernel("b", "sm90a", "fp8e4m3", "exact", p_mode_default=True, seqlen_min=4096, seqlen_max=None),
        kernel("c", "sm90a", "fp8e4m3", "lean", p_mode_default=False),
        kernel("d", "gfx950", "fp8e4m3", "lean"),
    ])
    rows = {(r["target"], r["p_mode"]): r for r in support.matrix(fake)}
    assert rows["sm90a", "exact"]["default"] and not rows["sm90a", "lean"]["default"]
    assert rows["sm90a", "exact"]["kernels"] == ["a (S < 4096)", "b (S >= 4096)"]
    assert rows["gfx950", "lean"]["default"]  # the only p_mode of its configuration
    assert rows["gfx950", "lean"]["verified"] == "simulated"
    assert rows["sm90a", "lean"]["verified"] == "measured on hardware"
    assert "| sm90a | FP8 e4m3 | 128/128 | exact (default) | a (S < 4096), b (S >= 4096) |" in \
        support.markdown(support.matrix(fake))


def test_a_row_with_two_offset_widths_names_the_wider():
    fake = SimpleNamespace(kernels=[kernel("n", "gfx950", "fp8e4m3", "lean", offset_bits=32),
                                    kernel("w", "gfx950", "fp8e4m3", "lean", offset_bits=64),
                                    kernel("x", "sm90a", "bf16", "bf16", offset_bits=64, seqlen_min=2048,
                                           seqlen_max=8192)])
    rows = {r["target"]: r for r in support.matrix(fake)}
    assert rows["gfx950"]["kernels"] == ["n", "w (64-bit offsets)"]
    assert rows["sm90a"]["kernels"] == ["x (2048 <= S < 8192)"]


def test_the_readme_shows_the_generated_table():
    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    assert support.markdown(support.matrix()) in readme, "regenerate it: python -m zyfa_tools.support"
