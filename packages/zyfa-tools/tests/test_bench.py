"""The benchmark: its configurations, rotation and idle rules, the CPU dry run end to end, the sustained mode."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from zyfa_tools.bench import __main__ as cli
from zyfa_tools.bench import contenders, runner
from zyfa_tools.bench.contenders import Contender, Skip
from zyfa_tools.bench.protocol import Clock, Config, Sustained, configurations, heads_for


def test_configurations_follow_the_protocol():
    configs = configurations()
    assert len(configs) == 2 * 2 * 5 * 2  # dtypes x head dims x S x (MHA, GQA)
    assert {(c.seqlen, c.heads) for c in configs} == {(2048, 128), (4096, 64), (8192, 32), (16384, 32),
                                                      (32768, 32)}
    assert {c.heads // c.heads_k for c in configs} == {1, 4}
    c = Config("bf16", 192, 128, 4096, 64, 16)
    assert c.flops == 64 * 4096**2 * 320 and c.kind == "GQA 4:1"
    assert heads_for(1024) == 256 and heads_for(65536) == 32


class RecordingClock(Clock):
    """Records which contender is timed when, and the idle periods, without timing anything."""

    def __init__(self):
        self.order, self.slept, self.settled = [], [], []
        super().__init__(torch.device("cpu"), sleep=self.slept.append)

    def settle(self, fns, seconds):
        self.settled.append(([fn() for fn in fns], seconds, len(self.order)))

    def kernel_ms(self, fn, calls, warmup):
        self.order.append(fn())
        return 1.0, "fake"

    def eager_ms(self, fn, calls):
        return 2.0


def fake_prepare(config, x, device, error=None, only=None, variants=()):
    return [Contender(n, lambda n=n: n, lambda out: out) for n in "abc"], [Skip("d", "not installed")]


@pytest.fixture
def fake_run(monkeypatch, tmp_path):
    monkeypatch.setattr(runner, "prepare_all", fake_prepare)
    monkeypatch.setattr(runner, "make_inputs", lambda *args: None)

    def go(configs, **kw):
        clock = RecordingClock()
        opts = runner.Options(configs, torch.device("cpu"), tmp_path, calls=1, warmup=0, rounds=3, idle_s=5.0,
                           error_max_seqlen=0, plots=False, **kw)
        return runner.run(opts, clock), clock

    return go


def test_rounds_rotate_the_order_and_long_sequences_start_idle(fake_run):
    configs = [Config("bf16", 128, 128, s, 32, 32) for s in (8192, 16384, 32768)]
    results, clock = fake_run(configs)
    assert clock.order[:9] == list("abc" "bca" "cab")
    assert clock.slept == [5.0, 5.0]  # before S = 16K and 32K, not before 8K
    row = results["rows"][0]
    assert row["kernel_ms_runs"] == [1.0, 1.0, 1.0] and row["eager_ms"] == 2.0
    assert row["tflops"] == pytest.approx(configs[0].flops / 1.0 / 1e9)
    assert results["skips"][0]["reason"] == "not installed"


def test_each_configuration_settles_its_contenders_before_the_first_round(fake_run):
    configs = [Config("bf16", 128, 128, s, 32, 32) for s in (2048, 4096)]
    _, clock = fake_run(configs, settle_s=1.5)
    # all contenders, before any timing of the configuration (3 contenders x 3 rounds each)
    assert clock.settled == [(list("abc"), 1.5, 0), (list("abc"), 1.5, 9)]
    assert fake_run(configs)[1].settled == []  # settle_s 0: none


def test_settle_calls_every_contender_until_the_time_is_up():
    calls = []

    def failing():
        calls.append("x")
        raise RuntimeError("a peer that fails")

    Clock(torch.device("cpu")).settle([lambda: calls.append("a"), failing, lambda: calls.append("b")], 0.01)
    assert calls[:3] == ["a", "x", "b"] and calls.count("x") == 1  # a failing call is left out after its first
    assert calls.count("a") == calls.count("b") > 1


def test_sustained_mode_idles_warms_and_repeats():
    slept, calls = [], []
    clock = Clock(torch.device("cpu"), sleep=slept.append)
    runs = clock.sustained_ms(lambda: calls.append(1), Sustained(idle_s=0.5, warm_s=0.01, timed_s=0.02, repeats=3))
    assert slept == [0.5, 0.5, 0.5] and len(runs) == 3 and all(ms > 0 for ms in runs)


def test_zyfa_without_a_kernel_is_a_skip_with_the_reason():
    config = Config("fp8", 256, 256, 4096, 32, 32)
    (made,) = contenders.zyfa_contenders(config, None, "sm90a")
    assert isinstance(made, Skip) and "no sm90a kernel for fp8 d 256/256" in made.reason


def test_each_p_mode_of_the_manifest_is_a_zyfa_contender(monkeypatch):
    import zyfa

    def entry(name, p_mode, default):
        return SimpleNamespace(name=name, p_mode=p_mode, fields={"p_mode_default": default})

    monkeypatch.setattr(contenders, "zyfa_kernels_for", lambda config, target: [
        entry("lean_a", "lean", True), entry("exact_a", "exact", False), entry("exact_b", "exact", False)])
    calls = []

    def flash_attn_func(q, k, v, causal=False, *, p_mode=None, **descales):
        calls.append(p_mode)
        return q

    monkeypatch.setattr(zyfa, "flash_attn_func", flash_attn_func)
    monkeypatch.setattr(contenders, "other_kernels", lambda config, kernels, p_mode: [])
    made = contenders.zyfa_contenders(Config("fp8", 128, 128, 4096, 32, 32), SimpleNamespace(
        q=1, k=2, v=3, descales={}), "sm90a")
    assert [(c.name, c.note) for c in made] == [("zyfa", "lean_a"), ("zyfa-exact", "exact_a, exact_b")]
    for contender in made:
        contender.call()
    assert calls == [None, "exact"]
    monkeypatch.setattr(zyfa, "flash_attn_func", lambda q, k, v, causal=False, **descales: q)
    made = contenders.zyfa_contenders(Config("fp8", 128, 128, 4096, 32, 32), None, "sm90a")
    assert isinstance(made[1], Skip) and "no p_mode keyword" in made[1].reason


def test_other_schedules_and_variants_are_launched_directly(monkeypatch):
    import zyfa
    import zyfa_kernels
    from zyfa.backends import sm90a

    config = Config("fp8", 128, 128, 2048, 8, 2)
    dispatched = contenders.zyfa_kernels_for(config, "sm90a")
    shipped = [k for k in zyfa_kernels.manifest().of("sm90a") if (k.dtype, k.d_qk, k.d_v) == ("fp8e4m3", 128, 128)]
    others = contenders.other_kernels(config, dispatched, contenders._default_p_mode(dispatched))
    assert {k.name for k in others}.isdisjoint({k.name for k in dispatched})
    assert {k.name for k in others} <= {k.name for k in shipped}
    variant = type(shipped[0])({**shipped[0].fields, "name": "fp8_variant"}, shipped[0]._root)
    bf16_variant = next(k for k in zyfa_kernels.manifest().of("sm90a") if k.dtype == "bf16")
    launches = []
    monkeypatch.setattr(sm90a, "run", lambda kernel, q, k, v, scale, layout, descales: launches.append(
        (kernel.name, scale, layout, [tuple(d.shape) for d in descales])) or (q, None))
    monkeypatch.setattr(zyfa, "flash_attn_func", lambda q, k, v, causal=False, **descales: q)
    one = torch.ones(1)
    x = SimpleNamespace(q=one, k=one, v=one, descales={"q_descale": one, "k_descale": one, "v_descale": one})
    made = contenders.zyfa_contenders(config, x, "sm90a", [variant, bf16_variant])
    names = [c.name for c in made]
    assert names[-1] == "fp8_variant" and bf16_variant.name not in names  # only the configuration's dtype
    labels = {f"zyfa-{contenders.kernel_label(k)}" for k in shipped}
    assert [n for n in names if n in labels] == [f"zyfa-{contenders.kernel_label(k)}" for k in others]
    made[-1].call()
    assert launches == [("fp8_variant", 128 ** -0.5, "bshd", [(1, 2)] * 3)]  # descales per (batch, kv head)
    (skip,) = contenders.zyfa_contenders(config, x, "gfx950", [variant])[-1:]
    assert isinstance(skip, Skip) and "sm90a only" in skip.reason


def test_a_failing_peer_is_a_skip_and_the_others_still_run(monkeypatch):
    def raises(config, x):
        raise RuntimeError("no kernel image for this shape\nmore detail")

    def call_fails(config, x):
        return Contender("late", lambda: (_ for _ in ()).throw(ValueError()), lambda out: out)

    def works(config, x):
        return Contender("good", lambda: torch.ones(1), lambda out: out)

    monkeypatch.setattr(contenders, "peers", lambda device: [("bad", raises), ("late", call_fails),
                                                             ("good", works)])
    ready, skipped = contenders.prepare_all(None, None, torch.device("cpu"), error=lambda out: 0.5,
                                            only=["bad", "late", "good"])
    assert [(c.name, c.error) for c in ready] == [("good", 0.5)]
    assert [(s.name, s.reason) for s in skipped] == [("bad", "RuntimeError: no kernel image for this shape"),
                                                      ("late", "ValueError: ")]


def test_zyfa_configurations_come_from_the_manifest():
    import zyfa_kernels

    found = contenders.zyfa_kernels_for(Config("bf16", 128, 128, 8192, 32, 32), "sm90a")
    assert found and {k.name for k in found} <= {k.name for k in zyfa_kernels.manifest().kernels}
    assert all((k.target, k.dtype, k.d_qk, k.d_v) == ("sm90a", "bf16", 128, 128) for k in found)


def test_cpu_dry_run_writes_table_csv_json_and_plots(tmp_path, capsys):
    out = tmp_path / "b"
    assert cli.main(["--device", "cpu", "--out", str(out), "--seqlens", "128", "--head-dims", "128",
                     "--rounds", "2"]) == 0
    results = json.loads((out / "bench.json").read_text())
    rows = results["rows"]
    assert {(r["dtype"], r["kind"], r["contender"]) for r in rows} == {
        ("bf16", "MHA", "zyfa"), ("bf16", "GQA 4:1", "zyfa"), ("fp8", "MHA", "zyfa"), ("fp8", "GQA 4:1", "zyfa"),
        ("bf16", "MHA", "sdpa-math"), ("bf16", "GQA 4:1", "sdpa-math")}
    for r in rows:
        assert len(r["kernel_ms_runs"]) == 2 and r["kernel_method"] == "wall"
        assert r["tflops"] == pytest.approx(4 * 128**2 * 256 / r["kernel_ms"] / 1e9)
        bound = 4e-3 if r["dtype"] == "bf16" else 3e-2  # the numerics' error on Gaussian inputs, not a loose pass
        assert 1e-4 < r["error_vs_fp64"] < bound
    assert [s["contender"] for s in results["skips"]] == ["sdpa-math", "sdpa-math"]
    assert "FP8" in results["skips"][0]["reason"]
    assert results["machine"]["versions"]["torch"] == torch.__version__
    with open(out / "bench.csv") as f:
        assert len(list(csv.DictReader(f))) == len(rows)
    assert (out / "throughput.png").stat().st_size > 0 and (out / "error_vs_speed.png").stat().st_size > 0
    printed = capsys.readouterr()
    assert "| fp8 | 128/128 | 128 | 4/1 | zyfa |" in printed.out and "Not measured:" in printed.out
    assert "16/16" not in printed.err and "4/4 fp8 d128/128 GQA 4:1" in printed.err  # the progress bar


def test_cpu_sustained_dry_run(tmp_path):
    out = tmp_path / "s"
    cli.main(["--device", "cpu", "--sustained", "--out", str(out), "--seqlens", "128", "--dtypes", "bf16",
              "--head-dims", "128", "--contenders", "zyfa", "--no-plots"])
    results = json.loads((out / "bench.json").read_text())
    (row,) = results["rows"]
    assert row["kernel_method"] == "sustained" and row["inputs"] == "activation" and row["kind"] == "MHA"
    assert results["protocol"]["sustained"]["repeats"] == 1 and len(row["kernel_ms_runs"]) == 1


def test_help_teaches_and_bad_arguments_say_why(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.parse(["--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert "Contenders:" in text and "--sustained" in text and "Not measured" in text
    with pytest.raises(SystemExit):
        cli.parse(["--device", "cpu", "--contenders", "fa4"])
    assert "--contenders ['fa4']: not contenders on cpu" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.parse(["--device", "cpu", "--calls", "0"])
    assert "--calls must be at least 1" in capsys.readouterr().err


def test_a_variants_folder_without_a_manifest_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli.main(["--device", "cpu", "--variants", str(tmp_path), "--out", str(tmp_path / "out")])
    assert f"--variants {tmp_path}: no manifest.json there" in capsys.readouterr().err


def test_fa3_gets_the_shared_inputs_and_descales_per_kv_head(monkeypatch):
    import sys
    import types
    from importlib.machinery import ModuleSpec

    from zyfa_tools.bench.protocol import make_inputs

    seen = {}

    def flash_attn_func(q, k, v, causal=False, **descales):
        seen.update(descales, q=q, causal=causal)
        return torch.zeros(*q.shape[:3], v.shape[-1], dtype=torch.bfloat16)

    fake = types.ModuleType("fa3_fwd_interface")
    fake.__spec__ = ModuleSpec("fa3_fwd_interface", None)
    fake.flash_attn_func = flash_attn_func
    monkeypatch.setitem(sys.modules, "fa3_fwd_interface", fake)
    config = Config("fp8", 128, 128, 128, 8, 2)
    x = make_inputs(config, torch.device("cpu"))
    made = contenders._fa3(config, x)
    out = made.decode(made.call())
    assert seen["q"] is x.q and seen["causal"] and out.shape == (1, 128, 8, 128) and out.dtype == torch.float32
    for name in ("q_descale", "k_descale", "v_descale"):
        assert seen[name].shape == (1, 2) and torch.equal(seen[name][0], x.descales[name].expand(2))


def watched(seconds_asleep: float, limit: float | None = 1.0) -> subprocess.CompletedProcess:
    code = ("import time; from zyfa_tools.bench.protocol import watchdog\n"
            f"with watchdog('the body', {limit}):\n    time.sleep({seconds_asleep})\nprint('done')")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_watchdog_ends_a_run_that_hangs_and_names_it():
    hung = watched(30.0)
    assert hung.returncode == 3 and "the body did not finish within 1 s" in hung.stderr and "done" not in hung.stdout
    for finished in (watched(0.0), watched(2.0, limit=None)):  # in time, or with no limit
        assert finished.returncode == 0 and finished.stdout.strip() == "done"
