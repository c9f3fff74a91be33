"""Fixtures for the loader tests: a test-only manifest and the fake driver library."""

from __future__ import annotations

from pathlib import Path

import pytest

import zyfa_kernels
from zyfa_kernels import loader
from zyfa_kernels.testing import build_fake_driver, fake_image, read_fake_driver_log, write_manifest

SYMBOL = "zyfa_test_fwd"


@pytest.fixture
def example_args() -> list[dict]:
    """Every argument type; natural layout q 0..8, seqlen 8..12, scale 12..16, jobs 16..24, tmap_k 64..192."""
    return [
        {"name": "q", "type": "ptr"},
        {"name": "seqlen", "type": "i32"},
        {"name": "scale", "type": "f32"},
        {"name": "jobs", "type": "i64"},
        {"name": "tmap_k", "type": "tmap"},
    ]


@pytest.fixture
def example_values() -> dict:
    return {"q": 0x7F00_1234_5600, "seqlen": 4096, "scale": 0.125, "jobs": -3, "tmap_k": bytes(range(128))}


@pytest.fixture
def example_image() -> bytes:
    """A fake code object holding SYMBOL with the natural layout of example_args."""
    return fake_image(SYMBOL, "0:8,8:4,12:4,16:8,64:128")


@pytest.fixture
def make_entry(example_args):
    """A manifest entry for a test kernel of `target`, with fields overridden by keyword."""

    def make(target: str, name: str, **overrides) -> dict:
        entry = {
            "name": name, "symbol": SYMBOL, "target": target, "file": f"objects/{target}/{name}.bin",
            "dtype": "bf16", "d_qk": 128, "d_v": 128, "p_mode": "bf16", "tile_m": 128 if target == "sm90a" else 256,
            "tile_n": 128, "scale_block": None, "rescale_threshold": 0.5, "threads": 384, "shared_bytes": 4096,
            "grid": "persistent", "args": example_args, "resources": {}, "p_mode_default": True, "p_shift": 0,
            "rowsum": "fp32", "schedule": "persistent", "seqlen_min": None, "seqlen_max": None, "offset_bits": 64,
            "masks_tail": False,
        }
        entry.update(overrides)
        return entry

    return make


@pytest.fixture
def test_manifest(tmp_path, make_entry, example_image):
    """One sm90a and one gfx950 test kernel, with fake images."""
    path = write_manifest(tmp_path / "package", [(make_entry("sm90a", "test_sm90a"), example_image),
                                                 (make_entry("gfx950", "test_gfx950"), example_image)])
    return zyfa_kernels.manifest(path)


@pytest.fixture(scope="session")
def fake_driver_library(tmp_path_factory) -> Path:
    return build_fake_driver(tmp_path_factory.mktemp("fake_driver"))


class FakeDriverLog:
    def __init__(self, path: Path):
        self.path = path

    def calls(self, *names: str) -> list[dict]:
        """The recorded calls, only those of `names` if given."""
        return [c for c in read_fake_driver_log(self.path) if not names or c["call"] in names]

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)


def forget_loaded_state(monkeypatch) -> None:
    """Start from a new process's loader state: no driver opened, no module loaded, no device queried."""
    monkeypatch.setattr(loader, "_drivers", {})
    monkeypatch.setattr(loader, "_functions", {})
    monkeypatch.setattr(loader, "_device_infos", {})


@pytest.fixture
def fake_driver(fake_driver_library, tmp_path, monkeypatch) -> FakeDriverLog:
    """The loader pointed at the fake driver for CUDA and HIP, logging to a file of this test."""
    for variable in ("ZYFA_FAKE_DRIVER_FAIL", "ZYFA_FAKE_DRIVER_MAX_SHARED", "ZYFA_FAKE_DRIVER_SMS",
                     "ZYFA_FAKE_DRIVER_DEVICES"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("ZYFA_CUDA_DRIVER", str(fake_driver_library))
    monkeypatch.setenv("ZYFA_HIP_DRIVER", str(fake_driver_library))
    log = tmp_path / "driver_calls.jsonl"
    monkeypatch.setenv("ZYFA_FAKE_DRIVER_LOG", str(log))
    forget_loaded_state(monkeypatch)
    return FakeDriverLog(log)


@pytest.fixture
def no_driver(monkeypatch, tmp_path):
    """The loader pointed at driver libraries that do not exist."""
    monkeypatch.setenv("ZYFA_CUDA_DRIVER", str(tmp_path / "missing" / "libcuda.so.1"))
    monkeypatch.setenv("ZYFA_HIP_DRIVER", str(tmp_path / "missing" / "libamdhip64.so"))
    forget_loaded_state(monkeypatch)
