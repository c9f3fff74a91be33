"""The sm90a build's nvcc lookup: the pinned release from the requirements, and clear errors for a missing or
different nvcc."""

from __future__ import annotations

import pytest

from asmgen import cuda_tools


@pytest.fixture(autouse=True)
def fresh_lookup():
    cuda_tools.nvcc.cache_clear()
    yield
    cuda_tools.nvcc.cache_clear()


def fake_nvcc(tmp_path, release: str):
    path = tmp_path / "nvcc"
    path.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V{release}'\necho 'Build cuda_x'\n")
    path.chmod(0o755)
    return path


def test_the_pin_comes_from_the_build_requirements():
    assert cuda_tools.pinned_release() == "13.0.88"
    text = cuda_tools.REQUIREMENTS.read_text()
    assert "nvidia-nvvm==13.0.88" in text and "nvidia-cuda-crt==13.0.88" in text


def test_env_nvcc_of_the_pinned_release_is_used(tmp_path, monkeypatch):
    monkeypatch.setenv("NVCC", str(fake_nvcc(tmp_path, "13.0.88")))
    assert cuda_tools.nvcc() == str(tmp_path / "nvcc")


def test_another_release_is_refused_with_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("NVCC", str(fake_nvcc(tmp_path, "12.8.93")))
    with pytest.raises(RuntimeError, match=r"is not nvcc 13\.0\.88 .*pip install -r asmgen/build-requirements.txt"):
        cuda_tools.nvcc()


def test_no_nvcc_says_what_to_install(monkeypatch):
    monkeypatch.delenv("NVCC", raising=False)
    monkeypatch.setattr(cuda_tools, "wheel_tool", lambda name: None)
    monkeypatch.setattr(cuda_tools.shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match=r"needs nvcc 13\.0\.88: pip install -r asmgen/build-requirements.txt"):
        cuda_tools.nvcc()
