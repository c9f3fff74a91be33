"""The sm90a backend on CPU: launch plans from shapes and strides, kernel choice, refusals, the kernels' build
description, and one launch through zyfa_kernels against the fake CUDA driver."""

from __future__ import annotations

import json
import math
import os
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import zyfa_kernels
from asmgen import sm90a as sources
from zyfa.backends import sm90a
from zyfa.numerics import LOG2E

SMS = 132
PACK = {"ptr": "<Q", "i64": "<q", "i32": "<i", "u32": "<I", "f32": "<f"}


def kernel(d_qk: int = 128, schedule: str = "pingpong", code_test: bool = False):
    return zyfa_kernels.manifest().find("sm90a", dtype="bf16", d_qk=d_qk, d_v=128, schedule=schedule,
                                        code_test=code_test)


def operands(batch, seqlen, heads, heads_k, d_qk, layout):
    def make(h, d):
        shape = (batch, seqlen, h, d) if layout == "bshd" else (batch, h, seqlen, d)
        return torch.empty(shape, dtype=torch.bfloat16)

    tensors = make(heads, d_qk), make(heads_k, d_qk), make(heads_k, 128), make(heads, 128)
    return tensors, [sm90a.Operand.of(t, layout) for t in tensors]


def test_every_built_kernel_is_in_the_manifest_as_described():
    for entry in sources.KERNELS:
        k = zyfa_kernels.manifest().find("sm90a", name=entry["name"])
        assert (k.symbol, k.args, k.shared_bytes, k.threads) == (entry["symbol"], entry["args"],
                                                                  entry["shared_bytes"], sources.THREADS)
        assert k.resources["local_bytes"] == 0 and k.resources["stack_bytes"] == 0
        assert k.shared_bytes <= sources.MAX_SHARED
        # nvcc aligns a tensor map's address in the parameter bank, not its offset in the buffer
        maps = [a for a in k.args if a["type"] == "tmap"]
        assert maps and all((a["offset"] + sources.PARAM_BANK_BASE) % 64 == 0 for a in maps)


def test_each_schedule_compiles_its_issue_order():
    for entry in sources.KERNELS:
        header = sources.config_header(entry)
        assert f"using Schedule = {'PingPong' if entry['schedule'] == 'pingpong' else 'Independent'};" in header
        assert f"kDynamicSharedBytes = {entry['shared_bytes'] - sources.RESERVED_SHARED};" in header


@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_plan_describes_the_tensors_by_strides(layout):
    batch, seqlen, heads, heads_k = 2, 512, 8, 2
    (q, k, v, out), (qo, ko, vo, oo) = operands(batch, seqlen, heads, heads_k, 128, layout)
    kern = kernel()
    p = sm90a.plan(kern, qo, ko, vo, oo, lse_ptr=0x1000, jobs_ptr=0x2000, num_jobs=40, grid=SMS,
                   softmax_scale=0.125)
    assert p.kernel is kern and p.grid == (40, 1, 1)
    spec = p.tensor_maps["k"]
    assert spec.address == k.data_ptr() and spec.dtype == "bf16" and spec.swizzle == 128
    assert spec.dims == (128, seqlen, heads_k, batch)  # innermost first: dim, seqlen, heads, batch
    seq_stride = heads_k * 128 if layout == "bshd" else 128
    head_stride = 128 if layout == "bshd" else seqlen * 128
    assert spec.strides_bytes == (2 * seq_stride, 2 * head_stride, 2 * seqlen * heads_k * 128)
    assert spec.box_dims == (64, kern.tile_n, 1, 1)
    assert p.tensor_maps["q"].dims == (128, seqlen, heads, batch)
    out_strides = (seqlen * heads * 128,) + ((heads * 128, 128) if layout == "bshd" else (128, seqlen * 128))
    assert p.args == {
        "out": out.data_ptr(), "lse": 0x1000, "jobs": 0x2000, "num_jobs": 40, "seqlen": seqlen, "heads": heads,
        "heads_k": heads_k, "scale_log2": 0.125 * LOG2E, "out_stride_b": out_strides[0],
        "out_stride_s": out_strides[1], "out_stride_h": out_strides[2],
    }


def test_plan_grid_is_persistent():
    _, (qo, ko, vo, oo) = operands(1, 256, 4, 4, 128, "bshd")
    p = sm90a.plan(kernel(), qo, ko, vo, oo, 0x1000, 0x2000, num_jobs=10_000, grid=SMS, softmax_scale=1.0)
    assert p.grid == (SMS, 1, 1)


def test_plan_refuses_what_the_kernel_cannot_address():
    _, (qo, ko, vo, oo) = operands(1, 256, 4, 2, 128, "bshd")
    misaligned = sm90a.Operand(qo.ptr + 8, qo.shape, qo.strides, 2)
    with pytest.raises(ValueError, match="q address and strides must be multiples of 16 bytes"):
        sm90a.plan(kernel(), misaligned, ko, vo, oo, 0x1000, 0x2000, 4, SMS, 1.0)
    short = sm90a.Operand(qo.ptr, (1, 200, 4, 128), qo.strides, 2)
    assert kernel().masks_tail  # the kernel masks its last tiles: any length
    assert sm90a.plan(kernel(), short, ko, vo, oo, 0x1000, 0x2000, 4, SMS, 1.0).args["seqlen"] == 200
    odd_heads = sm90a.Operand(qo.ptr, (1, 256, 3, 128), qo.strides, 2)
    with pytest.raises(ValueError, match="heads 3 must be a multiple of heads_k 2"):
        sm90a.plan(kernel(), odd_heads, ko, vo, oo, 0x1000, 0x2000, 4, SMS, 1.0)


def test_kernel_choice_follows_the_manifests_seqlen_ranges():
    """Each BF16 kernel of a head dim from its measured first S up to the next one's (asmgen.sm90a.BF16_SERVES_FROM):
    read from the entries' [seqlen_min, seqlen_max), which the build writes from it. FP8 has one kernel per head
    dims and p_mode."""
    for d_qk in (128, 192):
        kernels = sources.BF16_SERVES_FROM[d_qk]
        for (schedule, code_test, first), after in zip(kernels, [*(k[2] for k in kernels[1:]), 1 << 20], strict=True):
            name = next(k["name"] for k in sources.BF16_KERNELS
                        if (k["d_qk"], k["schedule"], k["code_test"]) == (d_qk, schedule, code_test))
            for seqlen in (max(first, 1), after - 1):
                assert sm90a.find_kernel(torch.bfloat16, d_qk, 128, seqlen).name == name
        for seqlen in (1, 4096, 1 << 20):
            assert sm90a.find_kernel(torch.float8_e4m3fn, d_qk, 128, seqlen).dtype == "fp8e4m3"
    for entry in sources.BF16_KERNELS:
        k = zyfa_kernels.manifest().find("sm90a", name=entry["name"])
        assert {"seqlen_min": k.seqlen_min, "seqlen_max": k.seqlen_max} == sources._seqlen_range(
            k.d_qk, k.schedule, k.fields["code_test"])
        assert (k.p_mode, k.p_mode_default, k.p_shift, k.rowsum, k.offset_bits) == ("bf16", True, 0, "fp32", 64)


def test_unsupported_inputs_are_refused_by_name():
    with pytest.raises(ValueError, match="sm90a: no kernel for bf16 inputs with head dims d_qk=64, d_v=64"):
        sm90a.find_kernel(torch.bfloat16, 64, 64, 1024)
    with pytest.raises(ValueError, match="p_mode='lean': sm90a has no bf16 kernel with that p_mode"):
        sm90a.find_kernel(torch.bfloat16, 128, 128, 1024, "lean")


def test_inspect_without_cuobjdump_says_what_to_install(monkeypatch):
    monkeypatch.delenv("CUOBJDUMP", raising=False)
    monkeypatch.setattr(sources.shutil, "which", lambda name: None)
    monkeypatch.setattr(sources.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(RuntimeError, match="needs cuobjdump: install the nvidia-cuda-cuobjdump package"):
        sources.inspect(sources.KERNELS[0], Path("unused.cubin"))


LAUNCH_SCRIPT = textwrap.dedent("""
    import json, sys
    import zyfa_kernels
    from zyfa.backends import sm90a
    kern = zyfa_kernels.manifest(sys.argv[1]).find("sm90a", d_qk=128)
    def operand(base, heads):
        return sm90a.Operand(base, (2, 1024, heads, 128), (1024 * heads * 128, heads * 128, 128, 1), 2)
    q, k, v, out = (operand(0x7F00_0000_0000 + i * 0x1000_0000, h) for i, h in enumerate((8, 2, 2, 8)))
    p = sm90a.plan(kern, q, k, v, out, 0x5000, 0x6000, 32, 132, 0.125)
    sm90a.launch(p, device=0, stream=0x1234)
    sm90a.launch(p, device=0, stream=0x1234)  # tensor maps come from the cache the second time
    print(json.dumps(p.args))
""")


def test_launch_through_the_loader_packs_the_plan(tmp_path):
    """One launch against the fake CUDA driver: block, grid, shared memory and every scalar at its offset."""
    from zyfa_kernels.testing import build_fake_driver, fake_image, read_fake_driver_log, write_manifest

    entry = next(e for e in sources.KERNELS if e["d_qk"] == 128 and e["schedule"] == "pingpong")
    layout = ",".join(f"{a['offset']}:{sources.ARG_SIZE[a['type']]}" for a in entry["args"])
    entry = {**entry, "target": "sm90a", "file": "objects/sm90a/fake.bin",
             "resources": {"static_shared_bytes": sources.RESERVED_SHARED}}
    manifest_path = write_manifest(tmp_path / "package", [(entry, fake_image(entry["symbol"], layout))])
    log = tmp_path / "calls.jsonl"
    env = {**os.environ, "ZYFA_CUDA_DRIVER": str(build_fake_driver(tmp_path)), "ZYFA_FAKE_DRIVER_LOG": str(log)}
    run = subprocess.run([sys.executable, "-c", LAUNCH_SCRIPT, str(manifest_path)], capture_output=True, text=True,
                         env=env)
    assert run.returncode == 0, run.stderr
    args = json.loads(run.stdout)
    calls = read_fake_driver_log(log)
    maps = [c for c in calls if c["call"] == "cuTensorMapEncodeTiled"]
    assert len(maps) == 3
    assert [m["address"] for m in maps] == [0x7F00_0000_0000, 0x7F00_1000_0000, 0x7F00_2000_0000]
    assert maps[1]["dims"] == [128, 1024, 2, 2] and maps[1]["box"] == [64, 128, 1, 1]
    launch, again = [c for c in calls if c["call"] == "cuLaunchKernel"]
    assert again["args"] == launch["args"]
    assert launch["result"] == 0 and launch["block"] == [sources.THREADS, 1, 1] and launch["grid"] == [32, 1, 1]
    assert launch["shared_bytes"] == entry["shared_bytes"] - sources.RESERVED_SHARED
    assert launch["stream"] == 0x1234
    buffer = bytes.fromhex(launch["args"])
    for arg in entry["args"]:
        if arg["type"] == "tmap":
            continue
        (value,) = struct.unpack_from(PACK[arg["type"]], buffer, arg["offset"])
        expected = args[arg["name"]]
        assert value == (struct.unpack("<f", struct.pack("<f", expected))[0] if arg["type"] == "f32" else expected)
    assert math.isclose(args["scale_log2"], 0.125 * LOG2E)


def test_descale_args_are_addresses_then_element_strides():
    """One-element descales read at (0, 0); (batch, heads_k) tensors and views of any strides at their own strides:
    nothing is expanded or copied."""
    one = torch.ones(1)
    full = torch.ones(3, 2)
    expanded = torch.ones(1, 2).expand(3, 2)
    transposed = torch.ones(2, 3).t()
    args = sm90a.descale_args((one, expanded, transposed))
    assert args == (one.data_ptr(), expanded.data_ptr(), transposed.data_ptr(), 0, 0, 0, 1, 1, 3)
    assert sm90a.descale_args((full, full, full))[3:] == (2, 1) * 3
