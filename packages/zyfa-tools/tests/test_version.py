"""The three wheels share one version and refuse a mismatched sibling."""

import re
from importlib import metadata
from pathlib import Path

import pytest

import zyfa
import zyfa_kernels
import zyfa_tools

PACKAGES = Path(__file__).resolve().parents[2]


def test_one_version_for_all_wheels():
    """The version is written once, in the repository's VERSION file: every pyproject takes it as dynamic (none
    writes its own), and the installed packages report it."""
    version = (PACKAGES.parent / "VERSION").read_text().strip()
    pyprojects = {p.name: (p / "pyproject.toml").read_text() for p in PACKAGES.iterdir()
                  if (p / "pyproject.toml").exists()}
    assert set(pyprojects) == {"zyfa-kernels", "zyfa-torch", "zyfa-tools"}
    for text in pyprojects.values():
        assert re.search(r'^dynamic = \[.*"version"', text, re.M) and not re.search(r"^version = ", text, re.M)
    assert {version} == {zyfa_tools.__version__} == {zyfa.__version__} == {zyfa_kernels.__version__}


def test_mismatched_zyfa_torch_refused(monkeypatch):
    monkeypatch.setattr(metadata, "version", lambda name: "0.0.9" if name == "zyfa-torch" else zyfa_tools.__version__)
    with pytest.raises(ImportError, match="zyfa-tools 0.1.0 needs zyfa-torch 0.1.0, but zyfa-torch 0.0.9"):
        zyfa_tools._require_matching_zyfa()
    monkeypatch.setattr(metadata, "version", lambda name: zyfa_tools.__version__)
    zyfa_tools._require_matching_zyfa()
