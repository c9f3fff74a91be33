"""The sm90a kernel variants the benchmark measures still compile for sm_90a without spills, and the ones prepared
for the next GPU run have the structure their docs claim (docs/sm90a.md). Needs nvcc and cuobjdump, like
`python -m asmgen.build --check`."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from asmgen import sm90a

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("sm90a_variants", ROOT / "benchmarks" / "sm90a_variants.py")
variants_script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(variants_script)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """The variants of docs/sm90a.md, "Prepared for the next run", built as the benchmark builds them."""
    folder = tmp_path_factory.mktemp("variants")
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sm90a_variants.py"), str(folder), "--only",
                    "cross_tile", variants_script.DEEPER, "--schedules", "pingpong", "independent"], check=True,
                   capture_output=True)
    return folder, json.loads((folder / "manifest.json").read_text())["kernels"]


def sass(path: Path) -> str:
    return subprocess.run([sm90a.cuobjdump(), "--dump-sass", str(path)], capture_output=True, text=True,
                          check=True).stdout


def test_prepared_variants_build_without_local_memory(prepared):
    folder, kernels = prepared
    names = {k["name"] for k in kernels}
    # cross_tile for both head dims and schedules; a third ring slot fits shared memory only at d = 128
    assert len(names) == 6 and all(n.endswith(("_cross_tile", "_stages3")) for n in names)
    for k in kernels:
        assert k["resources"]["local_bytes"] == 0 and k["resources"]["stack_bytes"] == 0
        assert k["shared_bytes"] <= sm90a.MAX_SHARED
        assert "LDL" not in sass(folder / k["file"]) and "STL" not in sass(folder / k["file"])


def test_cross_tile_adds_one_merged_step_with_the_softmax_under_p_v(prepared):
    folder, kernels = prepared
    for k in kernels:
        if not k["name"].endswith("_cross_tile"):
            continue
        code = [line.split(";")[0].split("*/")[-1].strip() for line in sass(folder / k["file"]).splitlines()
                if line.strip().startswith("/*") and "*/" in line]
        gemms_per_step = k["d_qk"] // 16 + 128 // 16  # QK^T k-steps + P V k-steps
        shipped = 3 * gemms_per_step  # first QK^T, the steady step and the diagonal step, the last P V
        assert sum("HGMMA" in c for c in code) == shipped + gemms_per_step
        # the merged step is the last QK^T + P V issue: between its S wait and its P V wait run all 64
        # exponentials of the next tile's first key tile (and the two rows' rescale factors)
        s_waits = [i for i, c in enumerate(code) if "DEPBAR.LE gsb0, 0x1" in c]
        pv_wait = next(i for i in range(s_waits[-1], len(code)) if "DEPBAR.LE gsb0, 0x0" in code[i])
        assert sum("MUFU.EX2" in c for c in code[s_waits[-1]:pv_wait]) >= 64


def test_shipped_kernels_take_the_measured_choices():
    for entry in sm90a.KERNELS:
        flags = sm90a.defines(entry)
        pinned = entry["schedule"] in sm90a.PINNED_SCHEDULES
        assert f"-DZYFA_PIN_SOFTMAX={int(pinned)}" in flags and f"-DZYFA_DESC_ADD={int(pinned)}" in flags
        assert "-DZYFA_CROSS_TILE=0" in flags and "-DZYFA_WAIT_HINT=0" in flags and "-DZYFA_DOUBLE_P=0" in flags
