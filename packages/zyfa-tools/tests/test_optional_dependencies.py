"""The core stays torch-only: importing any module loads neither transformers nor safetensors."""

from __future__ import annotations

import subprocess
import sys

MODULES = ("rotation", "smoothing", "quantize", "calibration", "evaluate", "capture", "hf", "models", "__main__")


def test_imports_load_no_optional_package():
    code = "import sys\n" + "".join(f"import zyfa_tools.{m}\n" for m in MODULES) + (
        "print(sorted(m for m in ('transformers', 'safetensors') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
