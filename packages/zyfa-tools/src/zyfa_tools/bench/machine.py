"""What a result depends on: versions of the software, the GPU, its clocks and power limit."""

from __future__ import annotations

import platform
import shutil
import subprocess
import sys
from importlib import metadata

import torch

# Distributions whose versions a result records when installed (ZYFA's and the peers').
DISTRIBUTIONS = ("zyfa-torch", "zyfa-kernels", "zyfa-tools", "torch", "numpy", "flash-attn-3", "fa3-fwd",
                 "nvidia-cudnn-frontend", "flashinfer-python", "aiter", "triton")
NVIDIA_SMI_FIELDS = ("name", "driver_version", "clocks.sm", "clocks.max.sm", "clocks.mem", "clocks.max.mem",
                     "power.limit", "power.default_limit", "power.max_limit", "temperature.gpu", "pstate")


def versions() -> dict:
    found = {"python": platform.python_version()}
    for name in DISTRIBUTIONS:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    found["cuda"] = torch.version.cuda
    found["hip"] = torch.version.hip
    if torch.backends.cudnn.is_available():
        found["cudnn"] = torch.backends.cudnn.version()
    return found


def nvidia_smi(index: int = 0) -> dict | None:
    """The GPU's clocks, power limits and state from nvidia-smi, or None where nvidia-smi is absent or fails."""
    if not shutil.which("nvidia-smi"):
        return None
    cmd = ["nvidia-smi", f"--id={index}", f"--query-gpu={','.join(NVIDIA_SMI_FIELDS)}", "--format=csv,noheader"]
    try:
        line = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError) as error:
        return {"error": str(error)}
    return dict(zip(NVIDIA_SMI_FIELDS, (v.strip() for v in line.split(",")), strict=False))


def describe(device: torch.device) -> dict:
    """Machine, device and versions, for the results' header."""
    info = {"platform": platform.platform(), "command": " ".join([sys.executable, *sys.argv]),
            "device": str(device), "versions": versions()}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info["gpu"] = {"name": props.name, "multiprocessors": props.multi_processor_count,
                       "memory_gib": round(props.total_memory / 2**30, 1),
                       "arch": getattr(props, "gcnArchName", None) or f"sm{props.major}{props.minor}"}
        info["nvidia_smi"] = nvidia_smi(device.index or 0)
    else:
        info["cpu"] = platform.processor() or platform.machine()
        info["threads"] = torch.get_num_threads()
    return info
