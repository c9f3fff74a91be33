"""Hatch metadata hook: the version, and the matching zyfa-kernels pin, from the repository's VERSION file."""

from __future__ import annotations

from pathlib import Path

from hatchling.metadata.plugin.interface import MetadataHookInterface

VERSION_FILE = Path(__file__).resolve().parents[2] / "VERSION"


class CustomMetadataHook(MetadataHookInterface):
    def update(self, metadata: dict) -> None:
        version = VERSION_FILE.read_text().strip()
        metadata["version"] = version
        metadata["dependencies"] = [f"zyfa-kernels=={version}", "torch>=2.6", "numpy"]  # numpy: the job tables
