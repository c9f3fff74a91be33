"""Backend choice by device (with fake device descriptions: there is no GPU here), ZYFA_BACKEND, and imports."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import zyfa
from zyfa import backends, flash_attn_func
from zyfa.backends import DeviceDescription, UnsupportedDeviceError, backend_name, reference


@pytest.mark.parametrize(
    ("description", "expected"),
    [
        (DeviceDescription("cpu"), "reference"),
        (DeviceDescription("cuda", "sm90", "NVIDIA H200"), "sm90a"),
        (DeviceDescription("rocm", "gfx950", "AMD Instinct MI355X"), "gfx950"),
    ],
)
def test_supported_devices(description, expected):
    assert backend_name(description) == expected
    assert backend_name(description, "reference") == "reference"


@pytest.mark.parametrize(
    "description",
    [
        DeviceDescription("cuda", "sm80", "NVIDIA A100"),
        DeviceDescription("cuda", "sm100", "NVIDIA B200"),
        DeviceDescription("cuda", "sm89", "NVIDIA L40S"),
        DeviceDescription("rocm", "gfx942", "AMD Instinct MI300X"),
        DeviceDescription("xpu"),
        DeviceDescription("mps"),
    ],
)
def test_devices_without_kernel_raise(description):
    with pytest.raises(UnsupportedDeviceError, match="ZYFA has no kernel for this device.*ZYFA_BACKEND=reference"):
        backend_name(description)
    assert backend_name(description, "reference") == "reference"


def test_unknown_forced_backend():
    with pytest.raises(ValueError, match="ZYFA_BACKEND='sm90a'.*'reference'"):
        backend_name(DeviceDescription("cpu"), "sm90a")


def fake_cuda(monkeypatch, hip, **props):
    monkeypatch.setattr(torch.version, "hip", hip)
    queries = []
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device: queries.append(device) or SimpleNamespace(**props))
    backends.describe_gpu.cache_clear()
    return queries


def test_device_properties_are_read_once_per_device(monkeypatch):
    queries = fake_cuda(monkeypatch, None, major=9, minor=0, name="NVIDIA H200", gcnArchName="")
    for _ in range(3):
        assert backends.describe(torch.device("cuda", 1)).arch == "sm90"
    assert queries == [1]
    backends.describe_gpu.cache_clear()


def test_describe_cuda(monkeypatch):
    fake_cuda(monkeypatch, None, major=9, minor=0, name="NVIDIA H200", gcnArchName="")
    assert backends.describe(torch.device("cuda", 0)) == DeviceDescription("cuda", "sm90", "NVIDIA H200")
    backends.describe_gpu.cache_clear()


def test_describe_rocm(monkeypatch):
    fake_cuda(monkeypatch, "7.0", major=9, minor=5, name="AMD Instinct MI355X", gcnArchName="gfx950:sramecc+:xnack-")
    assert backends.describe(torch.device("cuda", 0)) == DeviceDescription("rocm", "gfx950", "AMD Instinct MI355X")
    backends.describe_gpu.cache_clear()


def test_describe_other_devices():
    assert backends.describe(torch.device("cpu")) == DeviceDescription("cpu")
    assert backends.describe(torch.device("meta")) == DeviceDescription("meta")


def test_select_cpu_and_missing_module(monkeypatch):
    assert backends.select(torch.device("cpu")) is reference
    monkeypatch.setattr(backends, "describe", lambda device: DeviceDescription("cuda", "sm90", "NVIDIA H200"))
    monkeypatch.setitem(sys.modules, "zyfa.backends.sm90a", None)  # makes the import fail as if not installed
    monkeypatch.setattr(backends, "_loaded", {})
    monkeypatch.setattr(backends, "_selected", {})
    with pytest.raises(UnsupportedDeviceError, match=r"sm90a backend \(zyfa.backends.sm90a\) is not part"):
        backends.select(torch.device("cpu"))


def small_inputs():
    return [torch.randn(1, 8, 1, 128).to(torch.bfloat16) for _ in range(3)]


def test_public_api_on_device_without_kernel(monkeypatch):
    """A call on an unsupported GPU fails clearly; ZYFA_BACKEND=reference runs it on the reference path."""
    q, k, v = small_inputs()
    expected = flash_attn_func(q, k, v, causal=True)
    monkeypatch.setattr(backends, "describe", lambda device: DeviceDescription("cuda", "sm80", "NVIDIA A100"))
    monkeypatch.setattr(backends, "_selected", {})
    monkeypatch.delenv(backends.BACKEND_ENV, raising=False)
    with pytest.raises(UnsupportedDeviceError, match="cuda sm80 NVIDIA A100"):
        flash_attn_func(q, k, v, causal=True)
    monkeypatch.setenv(backends.BACKEND_ENV, "reference")
    assert torch.equal(flash_attn_func(q, k, v, causal=True), expected)


def test_public_api_uses_selected_backend(monkeypatch):
    """The op hands its normalised arguments to the module select() returns."""
    calls = []

    def forward(q, k, v, q_descale, k_descale, v_descale, softmax_scale, layout, p_mode):
        calls.append((q.shape, q_descale, softmax_scale, layout, p_mode))
        return reference.forward(q, k, v, q_descale, k_descale, v_descale, softmax_scale, layout, p_mode)

    monkeypatch.setattr(backends, "select", lambda device: SimpleNamespace(forward=forward))
    q, k, v = small_inputs()
    flash_attn_func(q, k, v, causal=True, softmax_scale=0.5, layout="bhsd")
    assert calls == [((1, 8, 1, 128), None, 0.5, "bhsd", None)]  # unpadded: the reference path takes any length
    q8, k8, v8 = (t.to(torch.float8_e4m3fn) for t in (q, k, v))
    flash_attn_func(q8, k8, v8, causal=True, q_descale=1.0, k_descale=1.0, v_descale=1.0, p_mode="lean")
    assert calls[1][4] == "lean" and calls[1][1].shape == (1,)  # a float descale: a one-element tensor


def test_cpu_path_reads_the_manifest_without_the_native_loader():
    code = (
        "import sys, torch, zyfa\n"
        "q = torch.zeros(1, 4, 1, 128, dtype=torch.bfloat16)\n"
        "zyfa.flash_attn_func(q, q, q, causal=True)\n"
        "assert 'zyfa_kernels.manifest' in sys.modules, 'the head dims come from the manifest'\n"
        "assert 'zyfa_kernels._loader' not in sys.modules, 'the native loader was imported'\n"
        "assert 'zyfa_kernels.loader' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_kernels_version_mismatch_refused(monkeypatch):
    def version(name):
        assert name == "zyfa-kernels"
        return "0.0.9"

    monkeypatch.setattr(metadata, "version", version)
    with pytest.raises(ImportError, match=f"zyfa {zyfa.__version__} needs zyfa-kernels.*0.0.9 is installed"):
        zyfa._require_matching_kernels()
    monkeypatch.setattr(metadata, "version", lambda name: zyfa.__version__)
    zyfa._require_matching_kernels()


def test_kernels_absent_accepted(monkeypatch):
    def missing(name):
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(metadata, "version", missing)
    zyfa._require_matching_kernels()


def zyfa_kernels_version():
    import zyfa_kernels

    return zyfa_kernels.__version__


def test_exports():
    version_file = Path(__file__).resolve().parents[3] / "VERSION"
    assert zyfa.__version__ == version_file.read_text().strip() == zyfa_kernels_version()
    assert set(zyfa.__all__) >= {
        "flash_attn_func", "flash_attn_qkvpacked_func", "flash_attn_kvpacked_func", "flash_attn_varlen_func",
        "fp8_quantize", "numerics", "__version__",
    }
    assert callable(zyfa.numerics.attention)
