"""Backend choice by device.

Every backend module has forward(q, k, v, q_descale, k_descale, v_descale, softmax_scale, layout, p_mode) ->
(out, lse), out contiguous in `layout`, lse contiguous. CPU tensors run `reference`; a CUDA GPU of compute
capability 9.0 runs `sm90a`; a ROCm gfx950 GPU runs `gfx950`; anything else is refused. ZYFA_BACKEND=reference
forces the reference path on any device. The GPU modules are imported on first use, so the CPU path never loads
the kernel package's native loader. A GPU's description is read once per device.
"""

from __future__ import annotations

import functools
import importlib
import os
from dataclasses import dataclass
from types import ModuleType

import torch

BACKEND_ENV = "ZYFA_BACKEND"
FORCEABLE = ("reference",)  # values ZYFA_BACKEND accepts ("" or unset: choose by device)
KERNEL_ARCHS = {("cuda", "sm90"): "sm90a", ("rocm", "gfx950"): "gfx950"}


class UnsupportedDeviceError(RuntimeError):
    """No ZYFA backend runs on this device."""


@dataclass(frozen=True)
class DeviceDescription:
    """What the choice depends on: platform ("cpu", "cuda", "rocm", or another device type) and architecture."""

    platform: str
    arch: str | None = None
    name: str = ""


CPU = DeviceDescription("cpu")


def describe(device: torch.device) -> DeviceDescription:
    if device.type == "cpu":
        return CPU
    if device.type != "cuda":
        return DeviceDescription(device.type)
    return describe_gpu(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=64)
def describe_gpu(index: int) -> DeviceDescription:
    """The description of CUDA / ROCm device `index`, queried once."""
    props = torch.cuda.get_device_properties(index)
    if torch.version.hip:
        return DeviceDescription("rocm", props.gcnArchName.split(":")[0], props.name)  # e.g. "gfx950:sramecc+:xnack-"
    return DeviceDescription("cuda", f"sm{props.major}{props.minor}", props.name)


def backend_name(description: DeviceDescription, forced: str = "") -> str:
    """The backend for a device; `forced` is the value of ZYFA_BACKEND."""
    if forced:
        if forced not in FORCEABLE:
            raise ValueError(f"{BACKEND_ENV}={forced!r}: the only value it accepts is 'reference' (or leave it unset)")
        return forced
    if description.platform == "cpu":
        return "reference"
    kernel = KERNEL_ARCHS.get((description.platform, description.arch))
    if kernel is None:
        device = " ".join(filter(None, (description.platform, description.arch, description.name)))
        raise UnsupportedDeviceError(
            f"ZYFA has no kernel for this device ({device}): kernels exist for NVIDIA Hopper (sm90) and AMD "
            f"MI355X (gfx950); set {BACKEND_ENV}=reference to run the slow reference path on it"
        )
    return kernel


def load(name: str) -> ModuleType:
    module = f"{__name__}.{name}"
    found = _loaded.get(module)
    if found is not None:
        return found
    try:
        found = _loaded[module] = importlib.import_module(module)
        return found
    except ModuleNotFoundError as error:
        if error.name != module:
            raise
        raise UnsupportedDeviceError(f"the {name} backend ({module}) is not part of this installation") from None


_loaded: dict[str, ModuleType] = {}


_selected: dict[tuple[torch.device, str], ModuleType] = {}  # (device, ZYFA_BACKEND) -> backend module


# os.environ.get costs about 1.5 us (key encoding and the Mapping layers): the call path reads the bytes mapping
# underneath it, which os.environ keeps in step with every change made through it (monkeypatch.setenv too).
_ENVIRON = getattr(os.environ, "_data", None) if os.name == "posix" else None
_BACKEND_KEY = BACKEND_ENV.encode()


def _forced() -> str:
    if _ENVIRON is None:
        return os.environ.get(BACKEND_ENV, "")
    value = _ENVIRON.get(_BACKEND_KEY)
    return "" if value is None else os.fsdecode(value)


def select(device: torch.device) -> ModuleType:
    """The backend module for tensors on `device` (chosen once per device and value of ZYFA_BACKEND)."""
    forced = _forced()
    found = _selected.get((device, forced))
    if found is None:
        found = load(backend_name(describe(device), forced))
        if len(_selected) < 64:
            _selected[(device, forced)] = found
    return found
