"""Host time per call of the public API, from the Python call to the kernel launch, beside torch SDPA and FA3.

Back-to-back eager calls of a small shape: the GPU finishes each kernel in a few microseconds, so the host is what
limits the call rate. Per round, `--calls` calls are timed on the host clock without synchronising (the launch
queue does not fill: the device keeps up), after `--warmup` calls; the median of `--rounds` rounds is reported as
us/call, with the range. Shapes: batch 1, `--heads` heads (MHA), d = 128, S in `--seqlens` (a length that is not a
multiple of the tiles shows the padding copies of kernels without masked tails), BF16 and FP8 (one-element
descale tensors, as fp8_quantize returns).

    python -m benchmarks.host_overhead                 # on an H100/H200: ZYFA, torch SDPA and FA3 (if importable)
    python -m benchmarks.host_overhead --fake          # anywhere: ZYFA's whole path against the fake CUDA driver
    python -m benchmarks.host_overhead --fake --profile 20  # and the 20 functions with the most own time (cProfile)
    python -m benchmarks.host_overhead --fake --fake-target gfx950  # the FP8 path of the gfx950 backend

--fake (the default without a CUDA GPU) runs CPU tensors through the sm90a backend as if they were on an H200:
the fake driver of zyfa_kernels.testing (built with `cc`) loads fake code objects with the manifest's argument
layouts and records nothing; only the device hooks (stream, device index, where a tensor lives, the job table
upload) are replaced, and
the value checks of CPU tensors skipped as they are for GPU tensors.
Kernels the manifest lacks (e.g. FP8 on sm90a) are reported as such. Prints a table and, with --out, writes JSON.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import platform
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

FAKE_DEVICES = {"sm90a": ("cuda", "sm90", "fake H200"), "gfx950": ("rocm", "gfx950", "fake MI355X")}


def fake_gpu(tmp: Path, target: str) -> str:
    """Route zyfa's `target` backend to the fake driver for CPU tensors; returns a description of the setup."""
    from zyfa_kernels.testing import build_fake_driver, fake_image, write_manifest

    os.environ["ZYFA_CUDA_DRIVER"] = os.environ["ZYFA_HIP_DRIVER"] = str(build_fake_driver(tmp))
    os.environ.pop("ZYFA_FAKE_DRIVER_LOG", None)
    import zyfa_kernels
    from zyfa_kernels.args import ARG_TYPES

    entries = []
    for kernel in zyfa_kernels.manifest().objects:  # the shipped entries, with fake objects of the same layouts
        params = ",".join(f"{offset}:{ARG_TYPES[kind].size}"
                          for offset, kind in zip(kernel.layout.offsets, kernel.layout.types, strict=True))
        entries.append((kernel.fields, fake_image(kernel.symbol, params if kernel.target == "sm90a" else None)))
    fake = zyfa_kernels.manifest(write_manifest(tmp / "package", entries))
    sys.modules["zyfa_kernels.manifest"]._packaged = lambda: fake

    from zyfa import backends, checks
    from zyfa.backends import device

    checks.cpu_values = lambda *args: None  # GPU tensors' values are not checked (that would wait for the device)
    backends.describe = lambda d: backends.DeviceDescription(*FAKE_DEVICES[target])
    device.device_index = lambda t: 0
    device.on_gpu = lambda t: True  # the FP8 V^T pre-pass launches its kernel too
    device.current_stream = lambda index: 0
    device.capturing = lambda: False
    device.upload = lambda host, index: (torch.from_numpy(host),) * 2  # job tables stay in host memory
    return f"{target} backend, fake driver (zyfa_kernels.testing), CPU tensors"


def inputs(seqlen: int, heads: int, dtype: torch.dtype, device: str, layout: str):
    shape = (1, seqlen, heads, 128) if layout == "bshd" else (1, heads, seqlen, 128)
    g = torch.Generator(device="cpu").manual_seed(seqlen)
    q, k, v = (torch.randn(shape, generator=g).to(device) for _ in range(3))
    if dtype == torch.bfloat16:
        return (q.bfloat16(), k.bfloat16(), v.bfloat16()), {}
    import zyfa

    (q8, qd), (k8, kd), (v8, vd) = (zyfa.fp8_quantize(t) for t in (q, k, v))
    return (q8, k8, v8), {"q_descale": qd, "k_descale": kd, "v_descale": vd}


def contenders(seqlen: int, heads: int, dtype: torch.dtype, device: str, fake: bool) -> dict:
    """name -> a call of that implementation (or the reason it cannot run)."""
    import zyfa

    (q, k, v), descales = inputs(seqlen, heads, dtype, device, "bshd")
    calls = {"zyfa": lambda: zyfa.flash_attn_func(q, k, v, causal=True, **descales)}
    if fake:
        return calls
    if dtype == torch.bfloat16:
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        calls["torch sdpa"] = lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=True)
    try:
        import fa3_fwd_interface as fa3
    except ImportError as error:
        calls["fa3"] = f"not importable ({error})"
    else:
        if dtype == torch.bfloat16:
            calls["fa3"] = lambda: fa3.flash_attn_func(q, k, v, causal=True)
        else:
            d = {name: value.reshape(1, 1).expand(1, heads).contiguous() for name, value in descales.items()}
            calls["fa3"] = lambda: fa3.flash_attn_func(q, k, v, causal=True, **d)
    return calls


def host_us(call, calls: int, warmup: int, rounds: int, sync) -> tuple[list[float], list[float]]:
    """Per round: wall-clock and process CPU microseconds per call (the CPU time is what a loaded machine's
    scheduler does not inflate)."""
    for _ in range(warmup):
        call()
    sync()
    wall, cpu = [], []
    for _ in range(rounds):
        start, start_cpu = time.perf_counter(), time.process_time()
        for _ in range(calls):
            call()
        wall.append((time.perf_counter() - start) / calls * 1e6)
        cpu.append((time.process_time() - start_cpu) / calls * 1e6)
        sync()
    return wall, cpu


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fake", action="store_true", help="the fake driver and CPU tensors (default without a GPU)")
    ap.add_argument("--fake-target", choices=sorted(FAKE_DEVICES), default="sm90a",
                    help="the backend the fake device runs (gfx950 times the FP8 path where sm90a has no FP8 kernel)")
    ap.add_argument("--seqlens", type=int, nargs="+",
                    help="sequence lengths (default 256 and 1000 on a GPU; 256 with --fake, where padding copies "
                         "would be CPU memory copies)")
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--calls", type=int, default=1000, help="calls per timed round")
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="also profile ZYFA's calls (cProfile) and print the N functions with the most own time")
    ap.add_argument("--out", type=Path, help="write the results as JSON here")
    args = ap.parse_args(argv)
    fake = args.fake or not torch.cuda.is_available()
    tmp = tempfile.TemporaryDirectory()
    if fake:
        setup, device, sync = fake_gpu(Path(tmp.name), args.fake_target), "cpu", lambda: None
    else:
        device, sync = "cuda", torch.cuda.synchronize
        setup = f"{torch.cuda.get_device_name()} (real driver)"
    seqlens = args.seqlens or ([256] if fake else [256, 1000])
    import zyfa

    report = {"setup": setup, "python": platform.python_version(), "torch": torch.__version__,
              "zyfa": zyfa.__version__, "cpu": platform.processor() or platform.machine(), "calls": args.calls,
              "rounds": args.rounds, "results": []}
    print(f"host time per call: {setup}; python {report['python']}, torch {report['torch']}, zyfa {report['zyfa']}",
          file=sys.stderr)
    with torch.inference_mode():
        for dtype in (torch.bfloat16, torch.float8_e4m3fn):
            for seqlen in seqlens:
                for name, call in contenders(seqlen, args.heads, dtype, device, fake).items():
                    row = {"impl": name, "dtype": str(dtype).removeprefix("torch."), "seqlen": seqlen,
                           "heads": args.heads}
                    if isinstance(call, str):
                        row["error"] = call
                    else:
                        try:
                            times, cpu = host_us(call, args.calls, args.warmup, args.rounds, sync)
                        except (ValueError, RuntimeError) as error:
                            row["error"] = str(error).splitlines()[0]
                        else:
                            row.update(us_per_call=statistics.median(times), min=min(times), max=max(times),
                                       cpu_us_per_call=statistics.median(cpu))
                            if args.profile and name == "zyfa":
                                profile(call, args.calls, args.profile)
                    report["results"].append(row)
                    print(format_row(row), file=sys.stderr)
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
    print(table(report))
    return 0


def profile(call, calls: int, top: int) -> None:
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        call()
    profiler.disable()
    pstats.Stats(profiler, stream=sys.stderr).sort_stats("tottime").print_stats(top)


def format_row(row: dict) -> str:
    what = f"{row['impl']:>10} {row['dtype']:>13} S={row['seqlen']:<6}"
    if "error" in row:
        return f"{what} -- {row['error']}"
    return (f"{what} {row['us_per_call']:8.1f} us/call (range {row['min']:.1f}-{row['max']:.1f}; CPU time "
            f"{row['cpu_us_per_call']:.1f})")


def table(report: dict) -> str:
    lines = [f"Host time per call ({report['setup']}; median of {report['rounds']} rounds of {report['calls']} calls)",
             "", "| impl | dtype | S | us/call | range | CPU us/call |", "|---|---|---|---|---|---|"]
    for row in report["results"]:
        if "error" in row:
            lines.append(f"| {row['impl']} | {row['dtype']} | {row['seqlen']} | - | {row['error']} | - |")
        else:
            lines.append(f"| {row['impl']} | {row['dtype']} | {row['seqlen']} | {row['us_per_call']:.1f} | "
                         f"{row['min']:.1f}-{row['max']:.1f} | {row['cpu_us_per_call']:.1f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
