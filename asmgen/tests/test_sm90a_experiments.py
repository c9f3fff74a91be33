"""The measurement variants of asmgen/sm90a/experiments build from the shipped kernels' configurations with one
choice changed, and none equal to its shipped kernel is built. Needs nvcc and cuobjdump, like
`python -m asmgen.build --check`."""

from __future__ import annotations

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

