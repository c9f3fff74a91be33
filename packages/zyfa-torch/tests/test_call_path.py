"""The GPU call path on the CPU: flash_attn_func through the sm90a and gfx950 backends to the fake driver's launch
(benchmarks/host_overhead.py's fake device), what each launch carries, what is copied, the bounded caches, and the
host-overhead benchmark itself."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

SCRIPT = textwrap.dedent("""
    import json, os, sys, tempfile
    from pathlib import Path
    import torch
    from benchmarks import host_overhead
    tmp = Path(tempfile.mkdtemp())
    target, fp8 = sys.argv[1].split("-")[0], sys.argv[1] != "sm90a"  # sm90a, sm90a-fp8 or gfx950 (FP8)
    host_overhead.fake_gpu(tmp, target)
    os.environ["ZYFA_FAKE_DRIVER_LOG"] = sys.argv[2]
    import zyfa
    from zyfa.backends import device, sm90a, gfx950
    torch.manual_seed(0)

    def inputs(seqlen, heads=4, heads_k=2):
        t = [torch.randn(1, seqlen, h, 128) for h in (heads, heads_k, heads_k)]
        if not fp8:
            return [x.bfloat16() for x in t], {}
        return [x.to(torch.float8_e4m3fn) for x in t], {"q_descale": 0.5, "k_descale": 0.25, "v_descale": 2.0}

    report = {"calls": []}
    kept = []  # every call's outputs stay alive: each launch then carries output pointers of its own
    def call(q, k, v, descales, tag):
        out, lse = zyfa.flash_attn_func(q, k, v, causal=True, return_lse=True, **descales)
        kept.append((out, lse))
        report["calls"].append({"tag": tag, "out": list(out.shape), "lse": list(lse.shape),
                                "q": q.data_ptr(), "k": k.data_ptr(), "v": v.data_ptr(),
                                "out_contiguous": out.is_contiguous()})

    (q, k, v), d = inputs(256)
    call(q, k, v, d, "first")
    (q2, k2, v2), d = inputs(256)
    call(q2, k2, v2, d, "same shape, new tensors")
    (q3, k3, v3), d = inputs(300)
    call(q3, k3, v3, d, "padded")
    kt = k.permute(0, 3, 1, 2).contiguous().permute(0, 2, 3, 1)  # stored (b, h, d, s), viewed as (b, s, h, d)
    call(q, kt, v, d, "permuted k")
    backend = gfx950 if target == "gfx950" else sm90a
    backend._prepared.size, device._job_tables.size = 8, 4  # the caches' bounds, made small to reach them
    for i in range(12):  # more shapes (and job tables) than the caches keep
        (a, b, c), d = inputs(1 + 40 * i, 1 + i, 1)
        zyfa.flash_attn_func(a, b, c, causal=True, **d)
    report["prepared"] = len(backend._prepared)
    report["job_tables"] = len(device._job_tables)
    report["limits"] = [8, 4]
    print(json.dumps(report))
""")


def run_path(tmp_path, target: str):
    log = tmp_path / "calls.jsonl"
    result = subprocess.run([sys.executable, "-c", SCRIPT, target, str(log)], cwd=ROOT,
                            capture_output=True, text=True, env={**os.environ, "ZYFA_BACKEND": ""}, timeout=600)
    assert result.returncode == 0, result.stderr
    from zyfa_kernels.testing import read_fake_driver_log

    return json.loads(result.stdout), read_fake_driver_log(log)


def test_sm90a_call_path_launches_with_each_calls_pointers(tmp_path):
    report, calls = run_path(tmp_path, "sm90a")
    launches = [c for c in calls if c["call"] == "cuLaunchKernel"]
    encoded = [c["address"] for c in calls if c["call"] == "cuTensorMapEncodeTiled"]
    first, second, padded, permuted = report["calls"]
    # one module load per kernel, one launch per call
    assert len(launches) == 4 + 12
    # new tensors of a seen shape: their addresses are encoded, nothing is re-planned
    assert {second["q"], second["k"], second["v"]} <= set(encoded)
    assert launches[0]["args"] != launches[1]["args"] and launches[0]["grid"] == launches[1]["grid"]
    # a length off the tiles runs unpadded (the kernels mask their last tiles: seqlen 300 in the arguments)
    import zyfa_kernels

    kernel = zyfa_kernels.manifest().find("sm90a", name="sm90a_fwd_bf16_d128_pingpong")
    offset = kernel.layout.offsets[kernel.layout.names.index("seqlen")]
    seqlens = [struct.unpack_from("<i", bytes.fromhex(launch["args"]), offset)[0] for launch in launches[:4]]
    assert kernel.masks_tail and seqlens == [256, 256, 300, 256]
    assert padded["out"] == [1, 300, 4, 128] and padded["lse"] == [1, 4, 300] and padded["out_contiguous"]
    # the permuted k (last dimension not contiguous) runs on a contiguous copy (its results: test_api_results)
    assert permuted["out"] == first["out"]
    # bounded caches
    assert report["prepared"] == report["limits"][0] and report["job_tables"] == report["limits"][1]


def test_sm90a_fp8_call_path_makes_v_transpose_with_one_launch(tmp_path):
    """Each FP8 call launches the transpose_v kernel on the call's V into a fresh V^T that the attention launch's
    tensor map reads, and passes the float descales as one-element tensors read at strides (0, 0)."""
    report, calls = run_path(tmp_path, "sm90a-fp8")
    import zyfa_kernels

    launches = [c for c in calls if c["call"] == "cuLaunchKernel"]
    transposes = [c for c in launches if c["function"] == "zyfa_sm90a_transpose_v_fp8_d128"]
    assert len(transposes) == len(launches) // 2 == 4 + 12
    t = zyfa_kernels.manifest().find("sm90a", kind="transpose_v", d_v=128)
    a = zyfa_kernels.manifest().find("sm90a", name="sm90a_fwd_fp8_d128_independent")

    def arg(launch, kernel, name, code):
        index = kernel.layout.names.index(name)
        return struct.unpack_from(code, bytes.fromhex(launch["args"]), kernel.layout.offsets[index])[0]

    second = report["calls"][1]
    assert arg(transposes[1], t, "v", "<Q") == second["v"] and arg(transposes[1], t, "seqlen", "<i") == 256
    encoded = [c["address"] for c in calls if c["call"] == "cuTensorMapEncodeTiled"]
    assert arg(transposes[2], t, "seqlen", "<i") == 300 and arg(transposes[2], t, "keys", "<i") == 304
    assert arg(transposes[1], t, "vt", "<Q") in encoded and transposes[1]["grid"] == [2, 2, 1]
    attention = [c for c in launches if c["function"] == a.symbol]
    strides = [arg(attention[1], a, f"{n}_descale_stride_{d}", "<i") for n in "qkv" for d in "bh"]
    assert strides == [0] * 6 and report["prepared"] == report["limits"][0]


def test_gfx950_call_path_takes_fp8_with_float_descales(tmp_path):
    report, calls = run_path(tmp_path, "gfx950")
    launches = [c for c in calls if c["call"] == "hipModuleLaunchKernel"]
    assert len(launches) == 4 + 12
    import zyfa_kernels

    kernel = zyfa_kernels.manifest().find("gfx950", name="fp8_d128")
    names = kernel.layout.names
    values = [struct.unpack_from("<Q", bytes.fromhex(launches[1]["args"]), kernel.layout.offsets[names.index(n)])[0]
              for n in ("q", "k", "v")]
    second = report["calls"][1]
    assert values == [second["q"], second["k"], second["v"]]  # each call's own pointers
    seqlen = kernel.layout.offsets[names.index("seqlen")]
    assert struct.unpack_from("<i", bytes.fromhex(launches[2]["args"]), seqlen)[0] == 512  # 300 padded to 256s
    assert report["prepared"] == report["limits"][0] and report["job_tables"] == report["limits"][1]


def test_host_overhead_benchmark_runs_on_the_fake_device(tmp_path):
    out = tmp_path / "host.json"
    result = subprocess.run([sys.executable, "-m", "benchmarks.host_overhead", "--fake", "--calls", "20", "--warmup",
                             "5", "--rounds", "2", "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    bf16 = next(r for r in report["results"] if r["dtype"] == "bfloat16")
    assert bf16["impl"] == "zyfa" and bf16["us_per_call"] > 0 and bf16["cpu_us_per_call"] > 0
    assert "| zyfa | bfloat16 | 256 |" in result.stdout
