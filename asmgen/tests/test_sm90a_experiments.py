"""The measurement variants of asmgen/sm90a/experiments build from the shipped kernels' configurations with one
choice changed, and none equal to its shipped kernel is built. Needs nvcc and cuobjdump, like
`python -m asmgen.build --check`."""

from __future__ import annotations

import subprocess
from pathlib import Path

from asmgen import sm90a
from asmgen.sm90a import experiments, sass


def test_vote_variants_vote_where_the_shipped_kernels_do_not(tmp_path):
    entries = experiments.build_variants(tmp_path, ["vote"])
    # every BF16 kernel but the one that already votes
    shipped = {(k["d_qk"], k["schedule"]) for k in sm90a.BF16_KERNELS} - sm90a.VOTE_MAX_KERNELS
    assert {(e["d_qk"], e["schedule"]) for e in entries} == shipped
    for entry in entries:
        assert entry["same_results_as_shipped"] and entry["resources"]["local_bytes"] == 0
        code = sass.instructions(tmp_path / entry["file"])
        assert any("VOTE.ANY" in c for c in code)
        assert not any(sass.LOCAL_MEMORY.search(c) for c in code)



def test_scattered_variants_rebuild_the_kernels_without_the_broadcast_index(tmp_path):
    entries = experiments.build_variants(tmp_path, ["scattered"], ["fp8e4m3"])
    assert {e["name"] for e in entries} == {f"{k['name']}_scattered" for k in sm90a.FP8_KERNELS}
    for entry in entries:
        code = sass.instructions(tmp_path / entry["file"])
        assert sum("R2UR" in c for c in code) > sum("GMMA" in c for c in code)  # descriptors cross one by one


def test_the_kept_patches_apply_to_the_current_sources():
    # the variants kept as patches must still apply (git apply --check changes nothing)
    root = Path(experiments.__file__).resolve().parents[3]
    for patch in sorted(Path(experiments.__file__).parent.glob("*.patch")):
        result = subprocess.run(["git", "apply", "--check", str(patch)], cwd=root, capture_output=True, text=True)
        assert result.returncode == 0, f"{patch.name}: {result.stderr}"
