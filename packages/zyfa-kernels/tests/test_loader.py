"""The loader against the fake driver: loading, caching, launching, the shared-memory check and driver errors."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

import zyfa_kernels
from zyfa_kernels import DriverError, DriverUnavailable, ManifestError
from zyfa_kernels.testing import fake_image, write_manifest

CUDA_LAUNCH = "cuLaunchKernel"
HIP_LAUNCH = "hipModuleLaunchKernel"
CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
STREAM = 0x5A5A_0000_1230


def test_import_needs_no_driver(tmp_path):
    """A fresh interpreter imports the package and packs arguments with no driver library anywhere."""
    env = {**os.environ, "ZYFA_CUDA_DRIVER": str(tmp_path / "none.so"), "ZYFA_HIP_DRIVER": str(tmp_path / "none.so")}
    code = ("import sys, zyfa_kernels, zyfa_kernels._loader; "
            "assert zyfa_kernels.__version__ == '0.1.0'; "
            "maps = open('/proc/self/maps').read(); "
            "assert 'none.so' not in maps and 'libcuda' not in maps and 'amdhip' not in maps")
    subprocess.run([sys.executable, "-c", code], env=env, check=True)


@pytest.mark.parametrize("target, variable", [("sm90a", "ZYFA_CUDA_DRIVER"), ("gfx950", "ZYFA_HIP_DRIVER")])
def test_using_a_missing_driver_raises_driver_unavailable(no_driver, test_manifest, example_values, target,
                                                          variable):
    kernel = test_manifest.find(target)
    with pytest.raises(DriverUnavailable, match=f"cannot be loaded .*{variable}"):
        zyfa_kernels.launch(kernel, device=0, grid=(1, 1, 1), stream=0, args=example_values)
    with pytest.raises(DriverUnavailable):
        zyfa_kernels.device_info(target, 0)


def test_a_library_without_the_entry_points_is_unavailable(no_driver, monkeypatch):
    monkeypatch.setenv("ZYFA_CUDA_DRIVER", "libc.so.6")
    with pytest.raises(DriverUnavailable, match="'libc.so.6' has no entry point cuInit"):
        zyfa_kernels.device_info("sm90a", 0)


def test_cuda_launch_records_the_exact_call(fake_driver, test_manifest, example_values, example_image):
    kernel = test_manifest.find("sm90a")
    zyfa_kernels.launch(kernel, device=1, grid=(132, 2, 1), stream=STREAM, args=example_values)

    loads = fake_driver.calls("cuModuleLoadData")
    assert [(c["device"], c["image"], c["result"]) for c in loads] == [(1, example_image.decode(), 0)]
    assert [c["name"] for c in fake_driver.calls("cuModuleGetFunction")] == ["zyfa_test_fwd"]
    (attribute,) = fake_driver.calls("cuFuncSetAttribute")
    assert (attribute["attribute"], attribute["value"]) == (CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 4096)
    (launch,) = fake_driver.calls(CUDA_LAUNCH)
    assert launch["result"] == 0
    assert launch["function"] == "zyfa_test_fwd" and launch["device"] == 1
    assert launch["grid"] == [132, 2, 1] and launch["block"] == [384, 1, 1]
    assert launch["shared_bytes"] == 4096 and launch["stream"] == STREAM
    assert launch["args"] == zyfa_kernels.pack_args(kernel, example_values).hex()
    assert launch["args_size"] == 192


def test_cuda_primary_context_is_made_current_and_restored(fake_driver, test_manifest, example_values):
    zyfa_kernels.launch(test_manifest.find("sm90a"), device=1, grid=(1, 1, 1), stream=0, args=example_values)
    calls = fake_driver.calls()
    assert [c["device"] for c in calls if c["call"] == "cuDevicePrimaryCtxRetain"] == [1]
    switches = [c["device"] for c in calls if c["call"] == "cuCtxSetCurrent"]
    assert switches == [1, -1] * 3  # around the load, the layout query and the launch; -1: no context before
    launch_at = next(i for i, c in enumerate(calls) if c["call"] == CUDA_LAUNCH)
    assert [c["device"] for c in calls[:launch_at] if c["call"] == "cuCtxSetCurrent"][-1] == 1


def test_modules_are_loaded_once_per_device(fake_driver, test_manifest, example_values):
    kernel = test_manifest.find("sm90a")
    for device in (0, 0, 1, 0, 1):
        zyfa_kernels.launch(kernel, device=device, grid=(1, 1, 1), stream=0, args=example_values)
    assert [c["device"] for c in fake_driver.calls("cuModuleLoadData")] == [0, 1]
    assert [c["device"] for c in fake_driver.calls(CUDA_LAUNCH)] == [0, 0, 1, 0, 1]
    assert len(fake_driver.calls("cuDevicePrimaryCtxRetain")) == 2


@pytest.mark.parametrize("target", ["sm90a", "gfx950"])
def test_shared_memory_beyond_the_device_limit_fails_before_loading(fake_driver, monkeypatch, tmp_path, make_entry,
                                                                     example_image, example_values, target):
    monkeypatch.setenv("ZYFA_FAKE_DRIVER_MAX_SHARED", "65536")
    entry = make_entry(target, "big", shared_bytes=65537)
    kernel = zyfa_kernels.manifest(write_manifest(tmp_path, [(entry, example_image)])).find(target)
    with pytest.raises(ValueError, match=r"big needs 65537 bytes of shared memory \(shared_bytes\) but device 0 "
                                         r"\(ZYFA fake .* device 0\) allows at most 65536"):
        zyfa_kernels.launch(kernel, device=0, grid=(1, 1, 1), stream=0, args=example_values)
    loads_or_launches = ("cuModuleLoadData", "hipModuleLoadData", CUDA_LAUNCH, HIP_LAUNCH)
    assert fake_driver.calls(*loads_or_launches) == []


def test_too_many_threads_fail_before_loading(fake_driver, tmp_path, make_entry, example_image, example_values):
    entry = make_entry("sm90a", "wide", threads=2048)
    kernel = zyfa_kernels.manifest(write_manifest(tmp_path, [(entry, example_image)])).find("sm90a")
    with pytest.raises(ValueError, match="wide needs 2048 threads per block but device 0 .* at most 1024"):
        zyfa_kernels.launch(kernel, device=0, grid=(1, 1, 1), stream=0, args=example_values)
    assert fake_driver.calls("cuModuleLoadData") == []


def test_driver_errors_name_the_call_and_code(fake_driver, monkeypatch, test_manifest, example_values):
    kernel = test_manifest.find("sm90a")
    monkeypatch.setenv("ZYFA_FAKE_DRIVER_FAIL", "cuModuleLoadData:200")
    with pytest.raises(DriverError, match=r"cuModuleLoadData failed with CUDA_ERROR_INVALID_IMAGE \(200\)") as error:
        zyfa_kernels.launch(kernel, device=0, grid=(1, 1, 1), stream=0, args=example_values)
    assert (error.value.call, error.value.code, error.value.name) == ("cuModuleLoadData", 200,
                                                                      "CUDA_ERROR_INVALID_IMAGE")
    assert isinstance(error.value, RuntimeError)
    assert fake_driver.calls(CUDA_LAUNCH) == []

    monkeypatch.setenv("ZYFA_FAKE_DRIVER_FAIL", "cuLaunchKernel:7777")  # a code the driver has no name for
    with pytest.raises(DriverError, match=r"cuLaunchKernel failed with an unknown error code \(7777\)"):
        zyfa_kernels.launch(kernel, device=0, grid=(1, 1, 1), stream=0, args=example_values)

    monkeypatch.delenv("ZYFA_FAKE_DRIVER_FAIL")  # the failures above left nothing half-loaded
    zyfa_kernels.launch(kernel, device=0, grid=(1, 1, 1), stream=0, args=example_values)
    assert [c["result"] for c in fake_driver.calls("cuModuleLoadData")] == [200, 0]
    assert [c["result"] for c in fake_driver.calls(CUDA_LAUNCH)] == [7777, 0]


def test_missing_symbol_and_bad_device(fake_driver, tmp_path, make_entry, example_values):
    image = fake_image("another_kernel", "0:8,8:4,12:4,16:8,64:128")
    kernel = zyfa_kernels.manifest(write_manifest(tmp_path, [(make_entry("sm90a", "k"), image)])).find("sm90a")
    with pytest.raises(DriverError, match=r"cuModuleGetFunction failed with CUDA_ERROR_NOT_FOUND \(500\)"):
        zyfa_kernels.launch(kernel, device=0, grid=(1, 1, 1), stream=0, args=example_values)
    with pytest.raises(DriverError, match=r"cuDeviceGet failed with CUDA_ERROR_INVALID_DEVICE \(101\)"):
        zyfa_kernels.device_info("sm90a", 7)


def test_argument_layout_is_checked_against_the_code_object(fake_driver, tmp_path, make_entry, example_values):
    # The object places tmap_k at 112, as nvcc does for a CUtensorMap parameter, and has one more parameter.
    image = fake_image("zyfa_test_fwd", "0:8,8:4,12:4,16:8,112:128,240:4")
    kernel = zyfa_kernels.manifest(write_manifest(tmp_path, [(make_entry("sm90a", "k"), image)])).find("sm90a")
    with pytest.raises(ManifestError, match=r"tmap_k: the code object has \(112, 128\), the manifest \(64, 128\); "
                                            r"the code object takes 6 parameters, the manifest lists 5"):
        zyfa_kernels.launch(kernel, device=0, grid=(1, 1, 1), stream=0, args=example_values)
    assert fake_driver.calls(CUDA_LAUNCH) == []


def test_declared_offsets_make_the_layout_match(fake_driver, tmp_path, make_entry, example_args, example_values):
    image = fake_image("zyfa_test_fwd", "0:8,8:4,12:4,16:8,112:128")
    args = [*example_args[:4], {**example_args[4], "offset": 112}]
    entry = make_entry("sm90a", "k", args=args)
    kernel = zyfa_kernels.manifest(write_manifest(tmp_path, [(entry, image)])).find("sm90a")
    zyfa_kernels.launch(kernel, device=0, grid=(1, 1, 1), stream=0, args=example_values)
    (launch,) = fake_driver.calls(CUDA_LAUNCH)
    assert bytes.fromhex(launch["args"])[112:240] == example_values["tmap_k"] and launch["args_size"] == 240


def test_hip_launch_records_the_exact_call(fake_driver, test_manifest, example_values, example_image):
    kernel = test_manifest.find("gfx950")
    zyfa_kernels.launch(kernel, device=1, grid=(256, 1, 1), stream=STREAM, args=example_values)
    zyfa_kernels.launch(kernel, device=1, grid=(256, 1, 1), stream=STREAM, args=example_values)

    assert [(c["device"], c["image"]) for c in fake_driver.calls("hipModuleLoadData")] == [
        (1, example_image.decode())]
    launches = fake_driver.calls(HIP_LAUNCH)
    assert len(launches) == 2
    for launch in launches:
        assert launch["result"] == 0 and launch["device"] == 1 and launch["function"] == "zyfa_test_fwd"
        assert launch["grid"] == [256, 1, 1] and launch["block"] == [384, 1, 1]
        assert launch["shared_bytes"] == 4096 and launch["stream"] == STREAM
        assert launch["args"] == zyfa_kernels.pack_args(kernel, example_values).hex()
    # The caller's current device (0) is given back after every switch to device 1.
    assert [c["device"] for c in fake_driver.calls("hipSetDevice")] == [1, 0, 1, 0, 1, 0]


def test_hip_errors_and_lds_accounting(fake_driver, monkeypatch, tmp_path, make_entry, example_image, example_values):
    entry = make_entry("gfx950", "k", shared_bytes=163840,
                       resources={"static_shared_bytes": 131072, "kernarg_size": 256})
    kernel = zyfa_kernels.manifest(write_manifest(tmp_path, [(entry, example_image)])).find("gfx950")
    monkeypatch.setenv("ZYFA_FAKE_DRIVER_FAIL", "hipModuleLoadData:200")
    with pytest.raises(DriverError, match=r"hipModuleLoadData failed with hipErrorInvalidImage \(200\)"):
        zyfa_kernels.launch(kernel, device=0, grid=(1, 1, 1), stream=0, args=example_values)
    monkeypatch.delenv("ZYFA_FAKE_DRIVER_FAIL")
    zyfa_kernels.launch(kernel, device=0, grid=(1, 1, 1), stream=0, args=example_values)
    (launch,) = fake_driver.calls(HIP_LAUNCH)
    assert launch["shared_bytes"] == 163840 - 131072  # the object's own LDS is not requested twice
    assert launch["args_size"] == 256 and launch["args"] == zyfa_kernels.pack_args(kernel, example_values).hex()


@pytest.mark.parametrize("target, name, warp", [("sm90a", "ZYFA fake CUDA device 1", 32),
                                                ("gfx950", "ZYFA fake HIP device 1", 64)])
def test_device_info(fake_driver, monkeypatch, target, name, warp):
    monkeypatch.setenv("ZYFA_FAKE_DRIVER_SMS", "256")
    monkeypatch.setenv("ZYFA_FAKE_DRIVER_MAX_SHARED", "163840")
    info = zyfa_kernels.device_info(target, 1)
    assert info["name"] == name and info["multiprocessors"] == 256 and info["max_shared_bytes"] == 163840
    assert info["warp_size"] == warp and info["max_threads_per_block"] == 1024
    if target == "sm90a":
        assert info["compute_capability"] == (9, 0)
    queried = len(fake_driver.calls())
    info["name"] = "changed"
    assert zyfa_kernels.device_info(target, 1)["name"] == name  # read once, handed out as copies
    assert len(fake_driver.calls()) == queried


@pytest.mark.parametrize("keywords, message", [
    ({"grid": (0, 1, 1)}, "grid must be a tuple of three integers"),
    ({"grid": [1, 1, 1]}, "grid must be a tuple"),
    ({"device": -1}, "device must be a non-negative integer"),
    ({"stream": -5}, "stream must be the raw"),
])
def test_launch_arguments_are_checked_before_the_driver(fake_driver, test_manifest, example_values, keywords,
                                                        message):
    call = {"device": 0, "grid": (1, 1, 1), "stream": 0, **keywords}
    with pytest.raises(ValueError, match=message):
        zyfa_kernels.launch(test_manifest.find("sm90a"), args=example_values, **call)
    with pytest.raises(ValueError, match=r"missing \['jobs'\]"):
        zyfa_kernels.launch(test_manifest.find("sm90a"), device=0, grid=(1, 1, 1), stream=0,
                            args={k: v for k, v in example_values.items() if k != "jobs"})
    assert fake_driver.calls() == []


def test_concurrent_first_launches_load_each_module_once(fake_driver, test_manifest, example_values):
    kernel = test_manifest.find("sm90a")
    barrier = threading.Barrier(8)

    def launch_many(device: int) -> None:
        barrier.wait()
        for _ in range(20):
            zyfa_kernels.launch(kernel, device=device, grid=(1, 1, 1), stream=0, args=example_values)

    threads = [threading.Thread(target=launch_many, args=(i % 2,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(c["device"] for c in fake_driver.calls("cuModuleLoadData")) == [0, 1]
    launches = fake_driver.calls(CUDA_LAUNCH)
    assert len(launches) == 160 and all(c["result"] == 0 for c in launches)


@pytest.mark.parametrize("target", ["sm90a", "gfx950"])
def test_prepared_launch_patches_each_calls_values_natively(fake_driver, test_manifest, example_values, target):
    """A prepared launch packs once and patches pointers, i32 and tensor maps per call: its buffers equal pack_args'
    of the same values; a value of the wrong type is explained by the checked packer, naming the argument."""
    kernel = test_manifest.find(target)
    names = kernel.layout.names
    per_call = [names.index(n) for n in ("q", "seqlen", "tmap_k")]
    template = [example_values[n] for n in names]
    prepared = zyfa_kernels.launcher(kernel, 0, (4, 1, 1)).prepare(template, per_call)
    fake_driver.clear()
    calls = [(0x1000, 7, bytes(128)), (0x2000, -5, bytes(range(128, 256)))]
    for values in calls:
        prepared.launch(STREAM, values)
    launches = fake_driver.calls(CUDA_LAUNCH if target == "sm90a" else "hipModuleLaunchKernel")
    for launch, (q, seqlen, tmap) in zip(launches, calls, strict=True):
        expected = {**example_values, "q": q, "seqlen": seqlen, "tmap_k": tmap}
        assert launch["args"] == zyfa_kernels.pack_args(kernel, expected).hex() and launch["grid"] == [4, 1, 1]
    with pytest.raises(TypeError, match="argument 'tmap_k' \\(tmap\\) must be 128 bytes"):
        prepared.launch(STREAM, (0x1000, 7, bytes(64)))
    with pytest.raises(ValueError, match="argument 'seqlen' = 4294967296 is outside the i32 range"):
        prepared.launch(STREAM, (0x1000, 2**32, bytes(128)))
    with pytest.raises(ValueError, match="2 per-call values for the 3 slots"):
        prepared.launch(STREAM, (0x1000, 7))
    with pytest.raises(ValueError, match="per-call arguments of types \\['f32'\\] are packed in Python only"):
        zyfa_kernels.launcher(kernel, 0, (4, 1, 1)).prepare(template, [names.index("scale")])
