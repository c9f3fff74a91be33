"""Measurement variants of the sm90a kernels: built on request, never shipped.

    python -m asmgen.sm90a.experiments DIR [--only NAME ...] [--dtype bf16|fp8e4m3 ...] [--patch NAME.patch ...]

Each variant is a shipped kernel with one choice of its Config changed (a manifest field, or a config_header keyword);
DIR gets the cubins and a manifest that the benchmarks (python -m zyfa_tools.bench, python -m benchmarks.sm90a_fp8
--variants DIR) and `measure.py --variants DIR` here (the shipped FP8 kernels, the variants and FA3 FP8 in one run:
accuracy against the model and float64, then speed) time and check against the model like the shipped kernels. A variant
equal to its shipped kernel is left out, and so is one that does not fit the registers (ptxas spills, which fails the
build: reported) or shared memory, or whose wgmmas ptxas serialised (fails the build too). Variants that need code the
shipped source does not hold are kept as patches here (timing.patch: a stopwatch in the key loops (measured), whose sums
`python -m asmgen.sm90a.experiments.timing DIR` prints; exp2_poly.patch: exponentials on the FMA pipe for a share of
exact P's scores; alternate.patch: the FP8 consumers take turns over their softmax, and pv_overlap.patch: the FP8
softmax under the consumer's own P V, both measured slower; halves.patch: FA3's overlap with 64-key tiles, prepared, it
spills; trio.patch: three FP8 consumer warpgroups of 160 registers with their GEMMs serialised through one accumulator,
measured slower up to 16K and +1% to +2% at 32K; diagonal_half.patch: the first BF16 consumer's diagonal key tile on the
64 keys its rows see; prefetch.patch: the job's row, Q and first K and V pulled ahead; one_tail.patch: the first-pair
loop without its tail's copy of a steady step; these three measured level or slower; stores_under_qk.patch: a tile's O
stored under the next tile's first QK^T, with the other waits of a query tile's first issue taken away (a second Q
buffer at d = 128, double_q, measured level alone; the first pair's second K ahead of its first V), measured slower;
tma_store.patch: O by tensor stores, measured +2% to +5% at 2K and 1-4% slower from 8K; timing_tma_store.patch: the
stopwatch and the tensor stores together, prepared to find where that loss lies; dynamic_jobs.patch: the CTAs take the
job rows from a counter, prepared; the patches retired once measured are listed in docs/sm90a.md, "Source layout"), the
FMA-pipe exponential the BF16 kernels measured as a header (exp2_poly.cuh, whose accuracy ci/gpu_exp2_poly.py checks),
and microbenchmarks of the FP8 softmax's pipes and of its step alone, the tensor pipe's rate under the kernels' GEMMs
and instruction fetch against code size (pipes.cu, softmax_alone.cu, gemm_ceiling.cu, code_fetch.cu: `python -m
asmgen.sm90a.experiments.microbench`), the job-table orders timed on the shipped kernels (`python -m
asmgen.sm90a.experiments.job_orders`), and a benchmark run's times split into a key-tile step and per-tile work (`python
-m asmgen.sm90a.experiments.fit`). --patch builds the variants a patch adds (or those --only names) in a copy of the
generator with the patch applied, the working tree left as it is; several patches build in turn, and variants built from
differently patched trees into one DIR share its manifest.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .. import (
    KERNELS,
    MAX_SHARED,
    STAGES,
    build,
    config_header,
    inspect,
    shared_bytes,
)

# name -> (manifest changes, build keywords, the p_modes of the shipped kernels it is built from), per element type
BF16_VARIANTS = {
    "stages3": ({"stages": STAGES + 1}, {}, ("bf16",)),  # a third K/V ring slot (fits at d = 128 only)
    # the consumers issuing independently, not in ping-pong turns: the same arithmetic, bitwise the same results
    "independent": ({"schedule": "independent", "same_results_as_shipped": True}, {}, ("bf16",)),
    # O stored straight from the accumulator in 4-byte stores, or by bulk copies, not staged (STORES): bitwise the
    # same results
    "direct": ({"same_results_as_shipped": True}, {"store": "direct"}, ("bf16",)),
    "bulk_store": ({"same_results_as_shipped": True}, {"store": "bulk"}, ("bf16",)),
    # the next step's K and V probed under the softmax (kProbeRing): bitwise the same results
    "probe": ({"same_results_as_shipped": True}, {"probe_ring": True}, ("bf16",)),
    # the moved-maximum test on the packed P (kCodeTest) where the shipped kernel has none, and the row maxima of
    # every tile where it has it: bitwise the same results
    "code_test": ({"same_results_as_shipped": True}, {"code_test": True}, ("bf16",)),
    "no_code_test": ({"same_results_as_shipped": True}, {"code_test": False}, ("bf16",)),
    # without the per-tile choices (kLeanEpilogue; in a code-test kernel kKFirst and its CODE_TEST_EDGE): O bitwise
    # the same, the lse within lg2.approx's error
    "no_tile_edges": ({}, {"tile_edges": False}, ("bf16",)),
}
FP8_VARIANTS = {
    "stages2": ({"stages": 2}, {}, ("exact",)),  # the K/V^T ring one slot shallower than shipped
    "stages3": ({"stages": 3}, {}, ("lean",)),  # one slot deeper
    "stages4": ({"stages": 4}, {}, ("exact",)),  # one slot deeper (fits at d = 128 only)
    # the other schedule (FP8_SCHEDULE), with the ring probe as shipped: the same arithmetic per consumer, so bitwise
    # the same results
    "pingpong": ({"schedule": "pingpong", "same_results_as_shipped": True}, {}, ("exact",)),
    "independent": ({"schedule": "independent", "same_results_as_shipped": True}, {}, ("lean",)),
    # the epilogues the kernel does not ship (STORES; the one it ships is left out as equal): bitwise the same results
    "direct": ({"same_results_as_shipped": True}, {"store": "direct"}, ("exact", "lean")),
    "staged": ({"same_results_as_shipped": True}, {"store": "staged"}, ("exact", "lean")),
    "bulk_store": ({"same_results_as_shipped": True}, {"store": "bulk"}, ("exact", "lean")),
    "no_probe": ({"same_results_as_shipped": True}, {"probe_ring": False}, ("exact", "lean")),
    # the row maxima of every tile, not the moved-maximum test on P's codes (kCodeTest): bitwise the same results
    "no_code_test": ({"same_results_as_shipped": True}, {"code_test": False}, ("exact", "lean")),
}


VARIANTS = {"bf16": BF16_VARIANTS, "fp8e4m3": FP8_VARIANTS}
NAMES = sorted({name for variants in VARIANTS.values() for name in variants})
PATCHES = sorted(path.name for path in Path(__file__).parent.glob("*.patch"))  # the kept patches, here
# what a patch may change besides the generator: the host backend (e.g. how an FP8 kernel gets V)
HOST_FILES = ("packages/zyfa-torch/src/zyfa/backends/sm90a.py",)


def build_variants(folder: Path, names=None, dtypes=None) -> list[dict]:
    """Build the variants `names` (default: all) of the shipped kernels of `dtypes` (default: all) into `folder`,
    adding them to the variants already there."""
    folder.mkdir(parents=True, exist_ok=True)
    entries = []
    for kernel in (k for k in KERNELS if not dtypes or k["dtype"] in dtypes):
        for suffix, (changes, flags, p_modes) in VARIANTS[kernel["dtype"]].items():
            if (names and suffix not in names) or kernel["p_mode"] not in p_modes:
                continue
            entry = {**kernel, **changes, "name": f"{kernel['name']}_{suffix}",
                     "file": f"{kernel['name']}_{suffix}.cubin"}
            entry["shared_bytes"] = shared_bytes(entry, flags.get("store"))
            if entry["shared_bytes"] > MAX_SHARED or \
                    config_header({**entry, "name": kernel["name"]}, **flags) == config_header(kernel):
                continue
            path = folder / entry["file"]
            try:
                build(entry, path, **flags)
            except RuntimeError as error:
                print(f"{entry['name']}: not built ({str(error).strip().splitlines()[-1][:160]})", file=sys.stderr)
                continue
            entries.append({**entry, "target": "sm90a", "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                            "resources": inspect(entry, path)["resources"]})
            print(f"[variant] {entry['name']} -> {path.name}", file=sys.stderr)  # as asmgen.build's lines
    from asmgen.build import VERSION

    # variants already in the folder stay unless rebuilt here: those of several patched trees share one folder
    manifest = folder / "manifest.json"
    built = {entry["name"] for entry in entries}
    kept = [e for e in json.loads(manifest.read_text())["kernels"] if e["name"] not in built] if manifest.exists() \
        else []
    manifest.write_text(json.dumps({"version": VERSION, "kernels": kept + entries}, indent=1))
    return entries


def patch_variants(patch: str) -> list[str]:
    """The variants the kept patch `patch` adds (its new entries of BF16_VARIANTS and FP8_VARIANTS)."""
    text = (Path(__file__).parent / patch).read_text()
    return sorted(set(re.findall(r'^\+\s+"(\w+)": \(', text, re.MULTILINE)))


@contextlib.contextmanager
def patched_tree(patch: str):
    """A temporary copy of the generator (asmgen/, VERSION and HOST_FILES) with the kept patch `patch` applied; the
    working tree stays as it is."""
    root = Path(__file__).resolve().parents[3]
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp)
        shutil.copytree(root / "asmgen", tree / "asmgen", ignore=shutil.ignore_patterns("__pycache__", "tests"))
        shutil.copy(root / "VERSION", tree)
        for name in HOST_FILES:
            (tree / name).parent.mkdir(parents=True)
            shutil.copy(root / name, tree / name)
        subprocess.run(["git", "apply", str(Path(__file__).parent / patch)], cwd=tree, check=True)
        yield tree


def build_patched(folder: Path, patch: str, names=None, dtypes=None) -> list[dict]:
    """build_variants in a copy of the generator with the kept patch `patch` applied (the working tree stays as it
    is), into `folder` beside the variants already there; returns the entries of the variants `names` (default: the
    patch's own, patch_variants)."""
    names = names or patch_variants(patch)
    if not names:
        raise ValueError(f"{patch}: its variants are not entries one can read from it (name them)")
    folder = Path(folder).resolve()
    with patched_tree(patch) as tree:
        command = [sys.executable, "-m", "asmgen.sm90a.experiments", str(folder)]
        command += ["--only", *names]
        command += ["--dtype", *dtypes] if dtypes else []
        subprocess.run(command, cwd=tree, check=True, stdout=subprocess.DEVNULL)  # its count: this call's
    entries = json.loads((folder / "manifest.json").read_text())["kernels"]
    return [e for e in entries if any(e["name"].endswith(f"_{name}") for name in names)]
