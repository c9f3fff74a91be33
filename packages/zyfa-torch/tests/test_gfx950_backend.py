"""The gfx950 backend without a GPU: the pure plan (kernel, grid, arguments) and its launch through the fake HIP
driver, which must carry exactly the manifest's argument buffer, the persistent grid, 512 threads and no dynamic
LDS (the code object declares its LDS)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import zyfa_kernels
from zyfa import jobs as job_tables
from zyfa.backends import gfx950

FP8 = torch.float8_e4m3fn
GRID = 256
THREADS = 512
FAKE_POINTERS = {"lse": 0x7000_0000, "jobs": 0x7100_0000, "descales": (0x7200_0000, 0x7200_1000, 0x7200_2000)}


def kernel(name: str):
    return zyfa_kernels.manifest().find(target="gfx950", name=name)


def tensors(batch, seqlen, heads, heads_k, d_qk, d_v, layout="bshd"):
    def make(h, d):
        shape = (batch, seqlen, h, d) if layout == "bshd" else (batch, h, seqlen, d)
        return torch.zeros(shape, dtype=FP8)
    return make(heads, d_qk), make(heads_k, d_qk), make(heads_k, d_v)


def make_plan(name, batch=2, seqlen=512, heads=8, heads_k=2, layout="bshd", scale=0.1, kern=None):
    kern = kern or kernel(name)
    q, k, v = tensors(batch, seqlen, heads, heads_k, kern.d_qk, kern.d_v, layout)
    out_shape = (batch, seqlen, heads, kern.d_v) if layout == "bshd" else (batch, heads, seqlen, kern.d_v)
    out = torch.zeros(out_shape, dtype=torch.bfloat16)
    ops = [gfx950.Operand.of(t, layout) for t in (q, k, v, out)]
    num_jobs = len(gfx950.host_job_table(batch, heads, seqlen // kern.tile_m, kern.grid_size))
    p = gfx950.plan(kern, *ops, FAKE_POINTERS["lse"], FAKE_POINTERS["descales"], FAKE_POINTERS["jobs"], num_jobs,
                    scale)
    return p, (q, k, v, out)


@pytest.mark.parametrize("name", ["fp8_d128", "fp8_d192"])
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_plan_fills_every_argument_from_the_tensors(name, layout):
    p, (q, k, v, out) = make_plan(name, layout=layout)
    assert p.grid == (GRID, 1, 1)
    assert set(p.args) == set(p.kernel.layout.names)
    seq_dim, head_dim = (1, 2) if layout == "bshd" else (2, 1)
    for tag, t in (("q", q), ("k", k), ("v", v), ("out", out)):
        assert p.args[tag] == t.data_ptr()
        assert (p.args[f"{tag}_stride_b"], p.args[f"{tag}_stride_s"], p.args[f"{tag}_stride_h"]) == (
            t.stride(0), t.stride(seq_dim), t.stride(head_dim))
    assert (p.args["seqlen"], p.args["heads"], p.args["heads_k"]) == (512, 8, 2)
    assert p.args["num_jobs"] == 2 * 8 * 1  # one pair of query tiles per (batch, head) at seqlen 512
    assert (p.args["q_descale"], p.args["k_descale"], p.args["v_descale"]) == FAKE_POINTERS["descales"]
    assert p.args["softmax_scale"] == 0.1
    zyfa_kernels.pack_args(p.kernel, p.args)  # every name and type accepted


def test_job_table_is_chiplet_ordered_and_covers_each_tile_once():
    table = gfx950.host_job_table(2, 3, 5, GRID)
    assert np.array_equal(table, job_tables.chiplet_order(job_tables.paired_jobs(2, 3, 5), GRID, gfx950.CHIPLETS))
    tiles = sorted((b, h, t) for b, h, lo, hi in table.tolist() for t in {lo, hi})
    assert tiles == [(b, h, t) for b in range(2) for h in range(3) for t in range(5)]


@pytest.mark.parametrize("change,message", [
    ({"seqlen": 384}, "multiple of the query tile"),
    ({"heads": 6, "heads_k": 4}, "multiple of heads_k"),
])
def test_plan_refuses_bad_shapes(change, message):
    with pytest.raises(ValueError, match=message):
        make_plan("fp8_d128", **change)


def test_plan_refuses_mismatched_head_dims_and_strided_last_dim():
    kern = kernel("fp8_d128")
    q, k, v = tensors(1, 256, 2, 2, 192, 128)
    ops = [gfx950.Operand.of(t, "bshd") for t in (q, k, v, torch.zeros(1, 256, 2, 128, dtype=torch.bfloat16))]
    with pytest.raises(ValueError, match="d_qk=128"):
        gfx950.plan(kern, *ops, 0, (0, 0, 0), 0, 1, 0.1)
    q2 = torch.zeros(1, 256, 2, 256, dtype=FP8)[..., ::2]
    ops[0] = gfx950.Operand.of(q2, "bshd")
    ops[1] = gfx950.Operand.of(torch.zeros(1, 256, 2, 128, dtype=FP8), "bshd")
    with pytest.raises(ValueError, match="contiguous last dimension"):
        gfx950.plan(kern, *ops, 0, (0, 0, 0), 0, 1, 0.1)


def test_bf16_takes_the_hip_kernels_and_fp8_needs_descales():
    assert gfx950.find_kernel(torch.bfloat16, 128, 128).name == "bf16_d128"
    assert gfx950.find_kernel(torch.bfloat16, 192, 128).name == "bf16_d192"
    # the BF16 kernels address each tensor from its base with 32-bit offsets; the FP8 ones each (batch, head) slice
    assert gfx950.span_bytes("bf16", (2, 256, 4, 128), (131072, 512, 128, 1), 2) == 2 * (131072 + 255 * 512 + 3 * 128
                                                                                        + 128)
    assert gfx950.span_bytes("fp8e4m3", (2, 256, 4, 128), (131072, 512, 128, 1), 1) == 255 * 512 + 128
    with pytest.raises(ValueError, match="more than the bf16 kernels at d_qk=128 address"):
        gfx950.find_kernel(torch.bfloat16, 128, 128, 1, None, 2**32)
    q8 = torch.zeros(1, 256, 2, 128, dtype=FP8)
    with pytest.raises(ValueError, match="q_descale is required"):
        gfx950.forward(q8, q8, q8, None, None, None, 0.1, "bshd")
    d = torch.ones(1, 2)
    with pytest.raises(ValueError, match="v_descale must be a contiguous float32"):
        gfx950.forward(q8, q8, q8, d, d, torch.ones(2, 1), 0.1, "bshd")


LAUNCH_SCRIPT = textwrap.dedent("""
    import sys
    import zyfa_kernels
    from test_gfx950_backend import make_plan
    from zyfa.backends import gfx950
    kern = zyfa_kernels.manifest(sys.argv[2]).find(target="gfx950", name=sys.argv[1])
    p, _ = make_plan(sys.argv[1], kern=kern)
    gfx950.launch(p, device=0, stream=0x1234)
    gfx950.launch(p, device=0, stream=0x1234)
    print(zyfa_kernels.pack_args(p.kernel, p.args).hex())
""")


@pytest.mark.parametrize("name", ["fp8_d128", "fp8_d192"])
def test_launch_through_the_fake_hip_driver_carries_the_plan(name, tmp_path):
    """The fake driver takes a stand-in image; the manifest entry (arguments, threads, LDS) is the real one."""
    from zyfa_kernels.testing import build_fake_driver, fake_image, read_fake_driver_log, write_manifest

    real = kernel(name)
    entry = {**real.fields, "file": f"objects/gfx950/{name}.co"}
    manifest_path = write_manifest(tmp_path / "pkg", [(entry, fake_image(real.symbol))])
    library = build_fake_driver(tmp_path)
    log = tmp_path / "calls.jsonl"
    env = dict(os.environ, ZYFA_HIP_DRIVER=str(library), ZYFA_CUDA_DRIVER=str(library), ZYFA_FAKE_DRIVER_LOG=str(log))
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.abspath(__file__)), *sys.path])  # this interpreter's
    run = subprocess.run([sys.executable, "-c", LAUNCH_SCRIPT, name, str(manifest_path)], env=env, capture_output=True,
                         text=True)
    assert run.returncode == 0, run.stderr
    calls = read_fake_driver_log(log)
    names = [c["call"] for c in calls]
    assert names.count("hipModuleLoadData") == 1  # the module is loaded once and cached
    launches = [c for c in calls if c["call"] == "hipModuleLaunchKernel"]
    assert len(launches) == 2
    p, _ = make_plan(name)
    expected = bytes.fromhex(run.stdout.split()[-1])  # the plan's buffer, with the subprocess's pointers
    assert len(expected) == p.kernel.layout.size
    for call in launches:
        assert call["function"] == p.kernel.symbol
        assert bytes.fromhex(call["args"]) == expected and call["args_size"] == len(expected)
        assert call["grid"] == [GRID, 1, 1] and call["block"] == [THREADS, 1, 1]
        assert call["shared_bytes"] == 0  # the code object declares its LDS (group segment) itself
        assert call["stream"] == 0x1234
    assert p.kernel.shared_bytes == p.kernel.resources["static_shared_bytes"] == p.kernel.resources["lds"]


def test_dispatch_reaches_every_gfx950_kernel_of_the_manifest():
    """Each gfx950 entry is what the dispatch picks for its own configuration: dtype, head dims, p_mode (a call
    without one gets the p_mode_default entry) and, for 64-bit-offset entries, slices beyond 32-bit offsets."""
    kernels = [k for k in zyfa_kernels.manifest().kernels if k.target == "gfx950"]
    assert {k.name for k in kernels} >= {"fp8_d128", "fp8_d128_exact", "fp8_d192", "bf16_d128", "bf16_d192",
                                          "fp8_d128_wide", "fp8_d192_wide"}
    dtypes = {"bf16": torch.bfloat16, "fp8e4m3": FP8}
    for k in kernels:
        span = 2**33 if k.fields["offset_bits"] == 64 else 0
        modes = [k.p_mode] + ([None] if k.fields["p_mode_default"] else [])
        if k.dtype == "bf16":
            modes = [None]
        for mode in modes:
            got = gfx950.find_kernel(dtypes[k.dtype], k.d_qk, k.d_v, 1, mode, span)
            assert got.name == k.name, (k.name, mode, span, got.name)
