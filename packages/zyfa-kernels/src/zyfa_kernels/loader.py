"""Launching code objects through the GPU driver: one driver per target, modules cached per (kernel, device).

Importing this module loads the native extension (the CPU path never does: zyfa_kernels imports it lazily).

sm90a goes through the CUDA driver (libcuda.so.1, or $ZYFA_CUDA_DRIVER), gfx950 through HIP (libamdhip64.so, or
$ZYFA_HIP_DRIVER). The library is opened on first use; loaded modules stay loaded for the life of the process.
"""

from __future__ import annotations

import struct
import threading

from . import _loader
from .args import ARG_TYPES
from .errors import ManifestError
from .manifest import TARGETS, Kernel
from .tensor_map import tensor_map_request

_DRIVER_TYPES = {"sm90a": _loader.CudaDriver, "gfx950": _loader.HipDriver}
MAX_GRID = 2**31 - 1

_lock = threading.RLock()  # loading a module may open the driver under the same lock
_drivers: dict[str, object] = {}
_device_infos: dict[tuple[str, int], dict] = {}
_functions: dict[tuple[int, int], tuple[Kernel, int]] = {}  # (id(kernel), device) -> (kernel, function handle)


def driver(target: str):
    """The extension's driver object for `target`; DriverUnavailable if its library cannot be opened."""
    found = _drivers.get(target)
    if found is None:
        if target not in _DRIVER_TYPES:
            raise ValueError(f"target {target!r} is not one of {TARGETS}")
        with _lock:
            found = _drivers.get(target)
            if found is None:
                found = _drivers[target] = _DRIVER_TYPES[target]()
    return found


def _device(device) -> int:
    if type(device) is not int or device < 0:
        raise ValueError(f"device must be a non-negative integer ordinal, got {device!r}")
    return device


def device_info(target: str, device: int) -> dict:
    """name, multiprocessors, max_shared_bytes (per block, opt-in limit on CUDA), max_threads_per_block,
    warp_size, l2_bytes, and on sm90a compute_capability (major, minor). Read once per device."""
    key = (target, _device(device))
    info = _device_infos.get(key)
    if info is None:
        info = driver(target).device_info(device)
        if target == "sm90a":
            info["compute_capability"] = (info.pop("compute_capability_major"), info.pop("compute_capability_minor"))
        _device_infos[key] = info
    return dict(info)


def _check_fits(kernel: Kernel, device: int) -> None:
    info = device_info(kernel.target, device)
    if kernel.shared_bytes > info["max_shared_bytes"]:
        raise ValueError(f"kernel {kernel.name} needs {kernel.shared_bytes} bytes of shared memory (shared_bytes) "
                         f"but device {device} ({info['name']}) allows at most {info['max_shared_bytes']} per block")
    if kernel.threads > info["max_threads_per_block"]:
        raise ValueError(f"kernel {kernel.name} needs {kernel.threads} threads per block but device {device} "
                         f"({info['name']}) allows at most {info['max_threads_per_block']}")


def _check_param_layout(kernel: Kernel, declared: list[tuple[int, int]] | None) -> None:
    """The argument buffer must place every parameter where the code object expects it: compare the layout
    the CUDA driver reports (None from drivers without cuFuncGetParamInfo) with the manifest's."""
    if declared is None:
        return
    ours = [(offset, ARG_TYPES[kind].size) for offset, kind in zip(kernel.layout.offsets, kernel.layout.types,
                                                                   strict=True)]
    if declared == ours:
        return
    problems = [f"{name}: the code object has ({offset}, {size}), the manifest ({our_offset}, {our_size})"
                for name, (offset, size), (our_offset, our_size) in zip(kernel.layout.names, declared, ours,
                                                                       strict=False)
                if (offset, size) != (our_offset, our_size)]
    if len(declared) != len(ours):
        problems.append(f"the code object takes {len(declared)} parameters, the manifest lists {len(ours)}")
    raise ManifestError(f"kernel {kernel.name}: the argument layout (offset, size) differs from the code object's: "
                        + "; ".join(problems) + ". Record the code object's offsets as \"offset\" in the "
                        "manifest's args.")


def function(kernel: Kernel, device: int) -> int:
    """The driver's function handle for `kernel` on `device`: loaded on first use (after checking that the
    kernel's shared memory and block size fit the device), then cached."""
    loaded = _functions.get((id(kernel), device))
    if loaded is not None:
        return loaded[1]
    with _lock:
        loaded = _functions.get((id(kernel), device))
        if loaded is None:
            _check_fits(kernel, device)
            loader = driver(kernel.target)
            if kernel.target == "sm90a":
                handle = loader.load(device, kernel.image(), kernel.symbol, kernel.dynamic_shared_bytes)
                _check_param_layout(kernel, loader.param_layout(device, handle))
            else:
                handle = loader.load(device, kernel.image(), kernel.symbol)
            loaded = _functions[(id(kernel), device)] = (kernel, handle)  # the kernel is kept: its id stays unique
    return loaded[1]


def _check_grid(grid) -> None:
    if type(grid) is not tuple or len(grid) != 3 or not all(type(g) is int and 1 <= g <= MAX_GRID for g in grid):
        raise ValueError(f"grid must be a tuple of three integers in [1, {MAX_GRID}], got {grid!r}")


def launch(kernel: Kernel, *, device: int, grid: tuple[int, int, int], stream: int, args: dict) -> None:
    """Launch `kernel` on `device` and the raw driver stream `stream` (0: the legacy default stream)."""
    _check_grid(grid)
    _device(device)
    _check_stream(stream)
    buffer = kernel.layout.pack(args, kernel.name)
    launcher(kernel, device, grid)(stream, buffer)


def _check_stream(stream) -> None:
    if type(stream) is not int or stream < 0:
        raise ValueError(f"stream must be the raw cudaStream_t / hipStream_t as a non-negative int, got {stream!r}")


class Launcher:
    """`kernel` bound to a device and a grid, checked and loaded once: calls only pack and launch.

    launcher(stream, buffer) launches with an argument buffer from pack_args; launcher.launch(stream, values)
    packs `values` given in the manifest's argument order first (the hot path's form: no dict)."""

    __slots__ = ("kernel", "device", "grid", "_block", "_function", "_launch", "_pack", "_pack_checked", "_shared",
                 "_driver")

    def __init__(self, kernel: Kernel, device: int, grid: tuple[int, int, int]):
        _check_grid(grid)
        self.kernel, self.device, self.grid = kernel, _device(device), grid
        self._function = function(kernel, device)
        self._driver = driver(kernel.target)
        self._launch = self._driver.launch
        self._block = (kernel.threads, 1, 1)
        self._shared = kernel.dynamic_shared_bytes
        self._pack = kernel.layout.packer.pack
        self._pack_checked = kernel.layout.pack_ordered

    def __call__(self, stream: int, buffer: bytes) -> None:
        self._launch(self.device, self._function, self.grid, self._block, self._shared, stream, buffer)

    def launch(self, stream: int, values) -> None:
        """values: in the manifest's argument order, of the types pack_args takes (bools are not refused here: the
        hot path packs with struct alone and explains only what struct refuses)."""
        try:
            buffer = self._pack(*values)
        except (struct.error, OverflowError, TypeError):
            buffer = self._pack_checked(values, self.kernel.name)  # raises, naming the argument
        self._launch(self.device, self._function, self.grid, self._block, self._shared, stream, buffer)


    def prepare(self, values, per_call) -> PreparedLaunch:
        """The hot path's launch: `values` in the manifest's order packed once (the indices in `per_call` hold
        placeholders, any value of their type); the result's launch(stream, per-call values) patches those in
        natively and launches."""
        return PreparedLaunch(self, values, per_call)


_SLOT_KINDS = {"ptr": 0, "i32": 1, "tmap": 2}  # the per-call argument types the native launch patches


class PreparedLaunch:
    """A Launcher's argument buffer packed once, with the per-call slots the extension patches in each launch
    (pointers, i32 strides, tensor maps): a call packs nothing in Python."""

    __slots__ = ("launcher", "_native", "_values", "_per_call")

    def __init__(self, launcher: Launcher, values, per_call):
        layout = launcher.kernel.layout
        kinds = [layout.types[i] for i in per_call]
        unsupported = sorted({kind for kind in kinds if kind not in _SLOT_KINDS})
        if unsupported:
            raise ValueError(f"kernel {launcher.kernel.name}: per-call arguments of types {unsupported} are packed in "
                             f"Python only; the native launch patches {sorted(_SLOT_KINDS)}")
        self.launcher, self._values, self._per_call = launcher, list(values), tuple(per_call)
        buffer = layout.pack_ordered(self._values, launcher.kernel.name)
        slots = [(layout.offsets[i], _SLOT_KINDS[kind]) for i, kind in zip(per_call, kinds, strict=True)]
        self._native = launcher._driver.prepare(launcher.device, launcher._function, launcher.grid, launcher._block,
                                                launcher._shared, buffer, slots)

    def launch(self, stream: int, per_call) -> None:
        try:
            self._native(stream, *per_call)
        except (TypeError, ValueError, OverflowError):  # explained by the checked packer, naming the argument
            if len(per_call) != len(self._per_call):
                raise ValueError(f"kernel {self.launcher.kernel.name}: {len(per_call)} per-call values for the "
                                 f"{len(self._per_call)} slots") from None
            values = self._values.copy()
            for index, value in zip(self._per_call, per_call, strict=True):
                values[index] = value
            launcher = self.launcher
            launcher(stream, launcher._pack_checked(values, launcher.kernel.name))  # raises, or packs e.g. numpy ints


def launcher(kernel: Kernel, device: int, grid: tuple[int, int, int]) -> Launcher:
    """A Launcher of `kernel` on `device` with `grid` (the module is loaded on first use, as by launch)."""
    return Launcher(kernel, device, grid)


def encode_tensor_map(dtype, global_address: int, dims, strides_bytes, box_dims, *, swizzle: int = 128,
                      element_strides=None, interleave: int = 0, l2_promotion: int = 128,
                      oob_fill: str = "zero") -> bytes:
    """A 128-byte CUtensorMap from cuTensorMapEncodeTiled, ready to pass as a "tmap" argument.

    dtype: "bf16", "fp8e4m3", "f32", ... or a torch dtype; dims and box_dims innermost first; strides_bytes the
    byte strides of dimensions 1.. (or of every dimension, the innermost being the element size); swizzle,
    interleave and l2_promotion in bytes; oob_fill "zero" or "nan"."""
    request = tensor_map_request(dtype, global_address, dims, strides_bytes, box_dims, swizzle=swizzle,
                                 element_strides=element_strides, interleave=interleave,
                                 l2_promotion=l2_promotion, oob_fill=oob_fill)
    return driver("sm90a").encode_tensor_map(**request)
