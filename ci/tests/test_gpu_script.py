"""The GPU validation script's gfx950 path without a GPU: target detection, ci/gpu.sh's dispatch by target (stage
lists, failures that do not stop later stages, the summary last), the check's configuration lists and verdict, the
check's accuracy path run on the CPU through the reference backend, the benchmark's configurations, inputs and
error measurement, and the result tables."""

from __future__ import annotations

import json
import math
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ci import gfx950_validation as cfg
from ci import gpu_target

ROOT = Path(__file__).resolve().parents[2]
CI = ROOT / "ci"

# ---- detection --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("hip,arch,capability,target", [
    ("6.4.43482", "gfx950:sramecc+:xnack-", None, "gfx950"),
    ("7.0.0", "gfx950", None, "gfx950"),
    (None, None, (9, 0), "sm90a"),
])
def test_target_for_supported_gpus(hip, arch, capability, target):
    assert gpu_target.target_for(hip, arch, capability) == target


@pytest.mark.parametrize("hip,arch,capability,match", [
    ("6.4", "gfx942:sramecc+:xnack-", None, "gfx942"),
    ("6.4", None, None, "unknown architecture"),
    (None, None, (8, 0), "8.0"),
    (None, None, (10, 0), "10.0"),
    (None, None, None, "no GPU"),
    ("6.4", "gfx950", (9, 0), None),  # a ROCm build is decided by the arch name alone
])
def test_target_for_other_gpus(hip, arch, capability, match):
    if match is None:
        assert gpu_target.target_for(hip, arch, capability) == "gfx950"
        return
    with pytest.raises(gpu_target.UnsupportedGpu, match=match):
        gpu_target.target_for(hip, arch, capability)


def test_detect_reads_torch(monkeypatch):
    class Props:
        name, major, minor, gcnArchName = "AMD Instinct MI355X", 9, 5, "gfx950:sramecc+:xnack-"

    monkeypatch.setattr(torch.version, "hip", "6.4.1", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: Props())
    target, description = gpu_target.detect()
    assert target == "gfx950" and "MI355X" in description and "gfx950" in description


# ---- ci/gpu.sh --------------------------------------------------------------------------------------------------

def run_script(*stages, env=None, tmp_path):
    full_env = {**os.environ, "OUT": str(tmp_path / "out"), **(env or {})}
    return subprocess.run(["bash", str(CI / "gpu.sh"), *stages], cwd=tmp_path, env=full_env, capture_output=True,
                          text=True, timeout=120)


def test_gpu_script_is_valid_bash():
    subprocess.run(["bash", "-n", str(CI / "gpu.sh")], check=True)


def test_gfx950_stages(tmp_path):
    result = run_script("nope", env={"GPU_TARGET": "gfx950"}, tmp_path=tmp_path)
    assert result.returncode == 2
    assert "unknown stage nope for gfx950 (install check bench summary small)" in result.stderr


def test_sm90a_stages_are_unchanged(tmp_path):
    result = run_script("nope", env={"GPU_TARGET": "sm90a"}, tmp_path=tmp_path)
    assert result.returncode == 2
    assert "unknown stage nope (install sass check sanitize bench exp2 variants ab profile)" in result.stderr
    text = (CI / "gpu.sh").read_text()
    assert "stages=(install sass check sanitize bench)" in text


def test_unknown_target_is_refused(tmp_path):
    result = run_script("check", env={"GPU_TARGET": "gfx942"}, tmp_path=tmp_path)
    assert result.returncode == 2 and "must be sm90a or gfx950" in result.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="detection finds the GPU here")
def test_no_gpu_stops_before_any_stage(tmp_path):
    result = run_script("summary", env={"GPU_TARGET": ""}, tmp_path=tmp_path)
    assert result.returncode != 0
    assert "sees no GPU" in result.stderr and "=== summary" not in result.stdout


def fake_python(tmp_path, failing: str) -> Path:
    """A python that fails on `-m failing` (a module) and runs every other command with this interpreter."""
    path = tmp_path / "python"
    path.write_text(f'#!/usr/bin/env bash\nif [ "$1 $2" = "-m {failing}" ]; then echo "{failing} failed" >&2; exit 1; '
                    f'fi\nexec "{sys.executable}" "$@"\n')
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def test_gfx950_failures_do_not_stop_later_stages(tmp_path):
    """A failing check still lets the summary run (printed last), and the run exits 1 naming the stage."""
    out = tmp_path / "out"
    out.mkdir()
    (out / cfg.CHECK_JSON).write_text(json.dumps(check_report(ok=False)))
    python = fake_python(tmp_path, "ci.gpu_check_gfx950")
    result = subprocess.run(["bash", "ci/gpu.sh", "check", "summary"], cwd=ROOT, capture_output=True, text=True,
                            env={**os.environ, "OUT": str(out), "GPU_TARGET": "gfx950", "PYTHON": str(python)},
                            timeout=120)
    assert result.returncode == 1, result.stderr
    assert "gfx950: failed stages: check" in result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[0] == "=== check" and "=== summary" in lines
    assert "FAILED accuracy" in result.stdout and lines[-1].startswith("bench: no results")


def test_sm90a_ab_times_and_compares_the_variants_and_fails_after_a_failed_check(tmp_path):
    """The ab stage: the variants' check (failing here), the quick benchmark with them all the same, the comparison
    against the shipped kernels and against AGAINST's variant, and exit 1 for the check at the end."""
    base = "sm90a_fwd_bf16_d128_code_test_pingpong"
    rows = [{"dtype": "bf16", "d_qk": 128, "kind": "MHA", "seqlen": 2048, "contender": name, "note": note,
             "kernel_ms": ms, "kernel_ms_runs": [ms] * 3}
            for name, note, ms in (("zyfa", base, 1.0), (f"{base}_a", f"{base}_a", 0.8),
                                   (f"{base}_b", f"{base}_b", 0.5), ("fa3", "fa3", 1.0))]
    (tmp_path / "bench.json").write_text(json.dumps({"rows": rows}))
    log, python = tmp_path / "calls.txt", tmp_path / "python"
    python.write_text("#!/usr/bin/env bash\n"
                      f'echo "$*" >> {log}\n'
                      'case "$2" in\n'
                      "  ci.gpu_check) exit 1 ;;\n"
                      f'  zyfa_tools.bench) mkdir -p "$OUT/ab" && cp {tmp_path / "bench.json"} "$OUT/ab/" ;;\n'
                      f'  *) exec "{sys.executable}" "$@" ;;\n'
                      "esac\n")
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "GPU_TARGET": "sm90a", "PYTHON": str(python), "VARIANTS": "VAR",
           "AGAINST": "a", "BENCH_ARGS": "--dtypes bf16 --seqlens 2048"}
    result = subprocess.run(["bash", "ci/gpu.sh", "ab"], cwd=ROOT, capture_output=True, text=True, env=env,
                            timeout=120)
    assert result.returncode == 1, result.stderr
    calls = log.read_text().splitlines()
    assert calls[0].startswith("-m ci.gpu_check --variants VAR")
    assert calls[1].startswith("-m zyfa_tools.bench --quick") and "--variants VAR" in calls[1]
    assert calls[1].endswith("--dtypes bf16 --seqlens 2048")
    assert f"| a | {base} | bf16 d 128 MHA | 2048 | +25.0% |" in (out / "ab/compare.md").read_text()
    assert f"| b | {base}_a | bf16 d 128 MHA | 2048 | +60.0% |" in (out / "ab/compare-a.md").read_text()
    result = subprocess.run(["bash", "ci/gpu.sh", "ab"], cwd=ROOT, capture_output=True, text=True,
                            env={**env, "VARIANTS": ""}, timeout=120)
    assert result.returncode != 0 and "the ab stage needs VARIANTS" in result.stderr


# ---- the check's configuration and verdict ----------------------------------------------------------------------

def test_check_configurations_cover_the_brief():
    configs = cfg.check_configurations()
    assert {dims for _, dims in configs} == {(128, 128), (192, 128)}
    for dims in cfg.HEAD_DIMS:
        cases = [c for c, d in configs if d == dims]
        assert {c.layout for c in cases} == {"bshd", "bhsd"}
        assert {c.descale for c in cases} == set(cfg.DESCALE_FORMS)
        assert {c.inputs for c in cases} == set(cfg.INPUT_KINDS)
        assert any(c.seqlen % 256 for c in cases), "odd lengths (padding)"
        assert any(c.seqlen % 2 for c in cases)
        assert any(c.batch > 1 for c in cases)
        assert any(c.heads_k == 1 and c.heads > 1 for c in cases), "MQA"
        assert any(1 < c.heads_k < c.heads for c in cases), "GQA"
        assert any(c.heads_k == c.heads for c in cases), "MHA"
        # some case has more jobs (pairs of 256-row query tiles per (batch, head)) than the persistent grid
        jobs = [c.batch * c.heads * math.ceil(math.ceil(c.seqlen / 256) / 2) for c in cases]
        assert max(jobs) > 256
    assert len(cfg.check_configurations(small=True)) == 2


def test_case_validation():
    with pytest.raises(ValueError):
        cfg.Case(1, 256, 3, 2, "bshd", "gaussian", "per_kv_head")
    with pytest.raises(ValueError):
        cfg.Case(1, 256, 2, 2, "sbhd", "gaussian", "per_kv_head")
    assert cfg.Case(2, 777, 8, 2, "bhsd", "gaussian", "float").label == "b2 s777 h8/2 bhsd gaussian float"


def good_result(**changes) -> dict:
    r = {"backend": "gfx950", "backend_ok": True, "finite": True, "deterministic": True, "rel_rms_vs_model": 2e-5,
         "frac_differing_vs_model": 1e-5, "lse_vs_model": 1e-7, "rel_rms_vs_fp64": 2.8e-2,
         "max_lse_diff_vs_fp64": 0.05, "model_rel_rms_vs_fp64": 2.8e-2}
    return {**r, **changes}


@pytest.mark.parametrize("changes,expected", [
    ({}, []),
    ({"backend": "reference", "backend_ok": False}, ["backend reference"]),
    ({"finite": False}, ["unwritten"]),
    ({"deterministic": False}, ["deterministic"]),
    ({"rel_rms_vs_model": 3e-3}, ["rel_rms_vs_model 0.003 > 0.001", "x model error"]),
    ({"rel_rms_vs_model": 5e-4, "model_rel_rms_vs_fp64": 4e-3}, ["x model error"]),
    ({"frac_differing_vs_model": 0.01}, ["frac_differing_vs_model"]),
    ({"lse_vs_model": 1e-4}, ["lse_vs_model"]),
    ({"rel_rms_vs_fp64": 0.07}, ["rel_rms_vs_fp64"]),
    ({"max_lse_diff_vs_fp64": 0.2}, ["max_lse_diff_vs_fp64"]),
    ({"rel_rms_vs_model": float("nan")}, ["rel_rms_vs_model nan", "x model error"]),
])
def test_verdict(changes, expected):
    failed = cfg.verdict(good_result(**changes))
    assert len(failed) == len(expected)
    for got, want in zip(failed, expected, strict=True):
        assert want in got


# ---- the check's accuracy path on the CPU (reference backend) -----------------------------------------------------

@pytest.fixture
def check_module(monkeypatch):
    from ci import gpu_check_gfx950 as check

    monkeypatch.setattr(check, "DEVICE", "cpu")
    monkeypatch.delenv("ZYFA_BACKEND", raising=False)
    return check


@pytest.mark.parametrize("case", [
    cfg.Case(1, 300, 2, 1, "bshd", "gaussian", "per_kv_head"),
    cfg.Case(2, 257, 4, 2, "bhsd", "activation", "one_element"),
    cfg.Case(1, 256, 2, 2, "bhsd", "gaussian_wide", "float"),
    cfg.Case(2, 200, 2, 1, "bshd", "gaussian", "expanded"),
])
@pytest.mark.parametrize("dims", cfg.HEAD_DIMS)
def test_check_case_through_the_reference_backend(check_module, case, dims):
    """On the CPU the public call runs the numerics model with the reference backend's key tile: the check's
    comparison with the model is exact, the fp64 bounds hold and a missing gfx950 backend is reported."""
    kernel = check_module.gfx950_kernels()[dims]
    assert check_module.backend_in_use() == "reference"
    r = check_module.check_case(case, kernel, "reference", "reference", 0)
    assert r["ok"], r["failed"]
    assert r["frac_differing_vs_model"] == 0 and r["lse_vs_model"] == 0 and r["deterministic"]
    assert r["out_shape"] == ([case.batch, case.seqlen, case.heads, dims[1]] if case.layout == "bshd"
                              else [case.batch, case.heads, case.seqlen, dims[1]])
    assert r["model"]["p_mode"] == ("lean" if dims[0] == 128 else "exact")
    strict = check_module.check_case(case, kernel, "reference", "gfx950", 0)
    assert not strict["ok"] and strict["failed"] == ["backend reference (expected gfx950)"]


def test_unwritten_outputs_are_caught(check_module, monkeypatch):
    """A backend that leaves one output row unwritten fails the coverage check (its output allocation is
    NaN-filled during the checked calls)."""
    from zyfa.backends import reference

    real_forward = reference.forward

    def forgetful_forward(*args):
        out, lse = real_forward(*args)
        partial = torch.empty_like(out)
        partial[:, :-1].copy_(out[:, :-1])  # bhsd: every head but the last,
        partial[:, -1:, :5].copy_(out[:, -1:, :5])  # and the last head's first 5 rows
        return partial, lse

    monkeypatch.setattr(reference, "forward", forgetful_forward)
    kernel = check_module.gfx950_kernels()[(128, 128)]
    case = cfg.Case(1, 256, 2, 1, "bhsd", "gaussian", "per_kv_head")  # no padding: every row is real
    r = check_module.check_case(case, kernel, "reference", "reference", 0)
    assert not r["finite"] and any("unwritten" in f for f in r["failed"])
    assert "lambda" not in repr(torch.empty) and "lambda" not in repr(torch.empty_like)  # restored


def test_check_script_small_run_on_the_cpu(check_module, tmp_path, capsys):
    """The script's main on the CPU: its small cases through the reference backend, the JSON and the table."""
    assert check_module.main(["--small", "--expect-backend", "reference", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "gpu_check_gfx950_small.json").read_text())
    others = check_module.other_kernels()  # exact P at d = 128 and the BF16 kernels: each on its head dims' cases
    assert {k.name for k in others} == {"fp8_d128_exact", "bf16_d128", "bf16_d192"}
    assert report["backend"] == "reference" and len(report["accuracy"]) == 2 + len(others)
    assert sorted(r["kernel"] for r in report["accuracy"][2:]) == sorted(k.name for k in others)
    assert all(r["ok"] for r in report["accuracy"]), [r["failed"] for r in report["accuracy"]]
    assert set(report["kernels"]) == {"128/128", "192/128"}
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("gpu_check_gfx950 (reference backend on cpu): 0 failure(s)")
    # without the rehearsal flag the same run fails: the reference backend is not the kernels
    assert check_module.main(["--small", "--out", str(tmp_path)]) == 1


def test_model_settings_come_from_the_manifest(check_module):
    kernels = check_module.gfx950_kernels()
    assert set(kernels) == set(cfg.HEAD_DIMS)
    for (d_qk, _), kernel in kernels.items():
        settings = check_module.model_settings(kernel, "gfx950")
        assert settings == {"p_mode": "lean" if d_qk == 128 else "exact", "p_shift": 8, "rowsum": "rounded",
                            "key_tile": kernel.tile_n, "block_scale": True, "scale_block": 64,
                            "rescale_threshold": 0.125}
        assert kernel.p_mode_default
        assert check_module.model_settings(kernel, "reference") == {"p_mode": settings["p_mode"], "key_tile": 128}


def test_descale_forms(check_module):
    shapes = {}
    for form in cfg.DESCALE_FORMS:
        case = cfg.Case(2, 64, 4, 2, "bshd", "gaussian", form)
        (q8, _, _), descales = check_module.fp8_inputs(case, 128, 128, seed=0)
        assert q8.dtype == torch.float8_e4m3fn
        shapes[form] = [d if isinstance(d, float) else (tuple(d.shape), d.stride()) for d in descales]
    assert shapes["per_kv_head"][0] == ((2, 2), (2, 1))
    assert shapes["one_element"][0] == ((1,), (1,))
    assert shapes["expanded"][0] == ((2, 2), (0, 0))
    assert isinstance(shapes["float"][0], float)


def test_guarded_reports_an_exception(check_module):
    def broken():
        raise RuntimeError("hipErrorLaunchFailure\nmore")

    r = check_module.guarded(broken, case="x", d_qk=128, d_v=128)
    assert not r["ok"] and r["error"] == "RuntimeError: hipErrorLaunchFailure" and r["failed"] == [r["error"]]


def test_bitwise_equal(check_module):
    a = torch.tensor([0.0, 1.0], dtype=torch.bfloat16)
    assert check_module.bitwise_equal(a, a.clone())
    assert not check_module.bitwise_equal(a, torch.tensor([-0.0, 1.0], dtype=torch.bfloat16))
    nan = torch.tensor([math.nan])
    assert check_module.bitwise_equal(nan, nan.clone())


# ---- the benchmark ------------------------------------------------------------------------------------------------

def test_bench_configurations_follow_the_protocol():
    configs = cfg.bench_configurations()
    assert len(configs) == 2 * 5 * 2
    for c in configs:
        assert c["batch"] == 1 and c["heads"] == max(32, 262144 // c["seqlen"])
        assert c["heads_k"] in (c["heads"], c["heads"] // 4)
    assert [c["seqlen"] for c in configs[:4]] == [2048, 2048, 4096, 4096]
    assert cfg.heads_for(2048) == 128 and cfg.heads_for(32768) == 32
    assert cfg.calls_for(8192, 100) == 100 and cfg.calls_for(32768, 100) == 8 and cfg.calls_for(16384, 500) == 125


def test_rotation():
    names = ["zyfa", "sdpa", "aiter"]
    assert [cfg.rotated(names, r) for r in range(4)] == [names, ["sdpa", "aiter", "zyfa"], ["aiter", "zyfa", "sdpa"],
                                                          names]
    assert cfg.rotated([], 3) == []


@pytest.mark.filterwarnings("ignore:.*(Flash attention|Memory efficient|Memory Efficient)")
def test_bench_problem_and_errors_on_the_cpu(monkeypatch):
    from ci import bench_gfx950 as bench

    monkeypatch.setattr(bench, "DEVICE", "cpu")
    monkeypatch.delenv("ZYFA_BACKEND", raising=False)
    p = bench.gaussian_problem(256, 8, 2, 192, 128)
    assert p.fp8_bhsd[0].shape == (1, 8, 256, 192) and p.fp8_bshd[2].shape == (1, 256, 2, 128)
    assert p.descale_kv[0].shape == (1, 2) and p.descale_kv[0].is_contiguous()
    out = p.zyfa()
    assert out.shape == (1, 8, 256, 128) and out.dtype == torch.bfloat16
    declined = {}
    names = bench.probe(bench.contenders(p, None), declined)
    assert names == ["zyfa", "zyfa_bf16"] and "sdpa" in declined  # SDPA's flash and efficient kernels need d_qk == d_v
    errs = bench.errors(p, ["zyfa", "sdpa"], heads=4, aiter_fn=None)  # a failing contender is left out
    assert set(errs) == {"zyfa"} and 1e-3 < errs["zyfa"] < 6e-2
    p128 = bench.gaussian_problem(256, 4, 4, 128, 128)
    errs = bench.errors(p128, bench.probe(bench.contenders(p128, None), {}), heads=2, aiter_fn=None)
    assert set(errs) == {"zyfa", "zyfa_bf16", "sdpa"} and errs["sdpa"] < 1e-2 and errs["zyfa"] < 6e-2
    assert errs["zyfa_bf16"] < 1e-2  # the BF16 kernels on the BF16 inputs
    sub = p.first_heads(4)
    assert sub.fp8_bhsd[0].shape[1] == 4 and sub.fp8_bhsd[1].shape[1] == 1 and sub.descale_kv[0].shape == (1, 1)


@pytest.mark.filterwarnings("ignore:.*(Flash attention|Memory efficient|Memory Efficient)")
def test_bench_script_on_the_cpu(monkeypatch, tmp_path, capsys):
    """The benchmark's main with the device timing replaced (the CPU has none): rows, declined peers, the sustained
    rows, the JSON, the markdown table, and the table printed last."""
    from ci import bench_gfx950 as bench

    monkeypatch.setattr(bench, "DEVICE", "cpu")
    monkeypatch.delenv("ZYFA_BACKEND", raising=False)
    monkeypatch.setitem(sys.modules, "aiter", None)

    class FakeClock:
        def kernel_ms(self, fn, calls, warmup):
            fn()
            return 2.0, "graph"

        def sustained_ms(self, fn, mode):
            fn()
            return [4.0] * mode.repeats

    monkeypatch.setattr(bench, "CLOCK", FakeClock())
    args = ["--out", str(tmp_path), "--seqlens", "256", "--heads", "4", "--rounds", "2", "--sustained-seqlens", "256",
            "--quick-sustained", "--idle", "0"]
    assert bench.main(args) == 0
    report = json.loads((tmp_path / cfg.BENCH_JSON).read_text())
    assert len(report["rows"]) == 4 and len(report["sustained"]) == 4
    assert report["aiter"] is None and "not importable" in report["aiter_note"]
    assert report["sustained_protocol"] == {"idle_s": 0.2, "warm_s": 0.1, "timed_s": 0.3, "repeats": 1}
    by_dims = {(r["d_qk"], r["heads_k"]): r for r in report["rows"]}
    assert by_dims[(128, 4)]["ms"] == {"zyfa": 2.0, "zyfa_bf16": 2.0, "sdpa": 2.0} and by_dims[(128, 1)]["heads"] == 4
    assert by_dims[(192, 4)]["ms"] == {"zyfa": 2.0, "zyfa_bf16": 2.0} and "sdpa" in by_dims[(192, 4)]["declined"]
    flops = 4 * 256 * 256 * 256
    assert by_dims[(128, 4)]["tflops"]["zyfa"] == pytest.approx(flops / 2.0 / 1e9)
    assert 1e-3 < by_dims[(128, 1)]["rel_rms_vs_fp64"]["zyfa"] < 6e-2
    assert report["sustained"][0]["ms"]["zyfa"] == 4.0
    assert (tmp_path / cfg.BENCH_MD).read_text().startswith("# gfx950 FP8 causal forward: cpu")
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-5].startswith("      d") and len(out[-4:]) == 4


def test_missing_aiter_is_a_note(monkeypatch):
    from ci import bench_gfx950 as bench

    monkeypatch.setitem(sys.modules, "aiter", None)  # import fails
    fn, why = bench.find_aiter()
    assert fn is None and "aiter is not importable" in why


def bench_report(aiter=True) -> dict:
    row = {"batch": 1, "seqlen": 4096, "heads": 64, "heads_k": 16, "d_qk": 128, "d_v": 128,
           "tflops": {"zyfa": 1500.0, "sdpa": 750.0, **({"aiter": 1200.0} if aiter else {})},
           "rel_rms_vs_fp64": {"zyfa": 1.1e-2, "sdpa": 1.9e-3}, "declined": {}}
    declined = {**row, "d_qk": 192, "tflops": {"zyfa": 1400.0}, "declined": {"sdpa": "RuntimeError: no kernel"}}
    report = {"device": "AMD Instinct MI355X", "torch": "2.9", "hip": "7.0", "zyfa": "0.1.0",
              "aiter": "0.1.5" if aiter else None,
              "protocol": {"calls": 100, "warmup": 500, "rounds": 3, "idle_s": 5.0, "error_max_seqlen": 8192},
              "sustained_protocol": {"idle_s": 2.0, "warm_s": 1.0, "timed_s": 3.0, "repeats": 3},
              "rows": [row, declined], "sustained": [{**row, "inputs": "activation"}]}
    if not aiter:
        report["aiter_note"] = "aiter is not importable (ModuleNotFoundError: No module named 'aiter')"
    return report


def test_markdown_table():
    text = cfg.markdown(bench_report())
    lines = text.splitlines()
    assert lines[0] == "# gfx950 FP8 causal forward: AMD Instinct MI355X"
    row = next(line for line in lines if line.startswith("| 128/128 | 4096 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[3:9] == ["1500", "750", "1200", "2.000", "1.250", "29.8"]
    assert cells[9:] == ["1.10e-02", "1.90e-03", "n/a"]
    row192 = next(line for line in lines if line.startswith("| 192/128 |"))
    assert "| n/a |" in row192
    assert "- sdpa: RuntimeError: no kernel" in lines
    assert any("Sustained clocks" in line for line in lines)
    no_aiter = cfg.markdown(bench_report(aiter=False))
    assert "AITER not measured (aiter is not importable" in no_aiter


def test_bench_table_and_summary():
    table = cfg.bench_table(bench_report()["rows"])
    assert len(table) == 3 and "x aiter" in table[0] and "2.000" in table[1]
    lines = cfg.summary_lines(check_report(ok=True), bench_report())
    assert lines[0].startswith("check on AMD Instinct MI355X (gfx950 backend): 4/4 passed")
    assert any("zyfa FP8 / SDPA BF16: geometric mean 2.000 over 1 configurations" in line for line in lines)
    assert any("zyfa FP8 / AITER FP8: geometric mean 1.250" in line for line in lines)
    lines = cfg.summary_lines(check_report(ok=False), bench_report(aiter=False))
    assert "2/4 passed" in lines[0] and sum("FAILED" in line for line in lines) == 2
    assert any("no AITER FP8 figures: aiter is not importable" in line for line in lines)
    assert cfg.summary_lines(None, None) == ["check: no results", "bench: no results"]


def test_summary_script(tmp_path, capsys):
    (tmp_path / cfg.CHECK_JSON).write_text(json.dumps(check_report(ok=True)))
    assert cfg.main(["--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "gfx950 summary:" and out[-1] == "bench: no results"


def check_report(ok: bool) -> dict:
    acc = [{**good_result(), "case": "b1 s256 h2/2 bshd gaussian per_kv_head", "d_qk": 128, "d_v": 128, "ok": True,
            "failed": []},
           {**good_result(), "case": "b1 s1000 h4/4 bshd activation per_kv_head", "d_qk": 192, "d_v": 128,
            "ok": ok, "failed": [] if ok else ["rel_rms_vs_model 0.002 > 0.001"]}]
    return {"device": "AMD Instinct MI355X", "backend": "gfx950", "accuracy": acc,
            "graph": [{"d_qk": 128, "ok": ok}], "compile": [{"d_qk": 128, "ok": True}]}
