"""The loader on a real NVIDIA Hopper GPU with a probe kernel (tests/gpu/loader_probe.cu).

Runs where torch sees a CUDA device of compute capability 9.x and the probe's cubin is at hand: built with nvcc
from the source, or named by ZYFA_LOADER_PROBE_CUBIN. Everywhere else these tests are skipped.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

import zyfa_kernels
from zyfa_kernels import DriverError, ManifestError, loader
from zyfa_kernels.testing import write_manifest

torch = pytest.importorskip("torch")
if not (torch.cuda.is_available() and torch.cuda.get_device_capability(0)[0] == 9):
    pytest.skip("needs an NVIDIA Hopper GPU", allow_module_level=True)

PROBE_SOURCE = Path(__file__).parent / "gpu" / "loader_probe.cu"
RECORD_WORDS = 24
DYNAMIC_SHARED = 100 * 1024  # above the 48 KiB a kernel gets without opting in
THREADS = 128
# nvcc aligns the CUtensorMap's address in the parameter bank, so it does not sit at its natural offset (64).
NATURAL_ARGS = [{"name": "out", "type": "ptr"}, {"name": "n", "type": "i32"}, {"name": "scale", "type": "f32"},
                {"name": "big", "type": "i64"}, {"name": "map", "type": "tmap"}, {"name": "flag", "type": "u32"}]


@pytest.fixture(scope="module")
def probe_cubin(tmp_path_factory) -> bytes:
    given = os.environ.get("ZYFA_LOADER_PROBE_CUBIN")
    if given:
        return Path(given).read_bytes()
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("needs nvcc or ZYFA_LOADER_PROBE_CUBIN for the probe kernel")
    output = tmp_path_factory.mktemp("probe") / "loader_probe.cubin"
    subprocess.run([nvcc, "-gencode", "arch=compute_90a,code=sm_90a", "-cubin", "-o", str(output),
                    str(PROBE_SOURCE)], check=True)
    return output.read_bytes()


def probe_kernel(tmp_path, cubin: bytes, args: list[dict], **overrides):
    entry = {
        "name": "loader_probe", "symbol": "loader_probe", "target": "sm90a", "file": "objects/sm90a/probe.cubin",
        "dtype": "bf16", "d_qk": 128, "d_v": 128, "p_mode": "bf16", "tile_m": 128, "tile_n": 128,
        "scale_block": None, "rescale_threshold": 0.5, "threads": THREADS, "shared_bytes": DYNAMIC_SHARED,
        "grid": "persistent", "args": args, "resources": {}, **overrides,
    }
    return zyfa_kernels.manifest(write_manifest(tmp_path, [(entry, cubin)])).find("sm90a")


@pytest.fixture(scope="module")
def map_offset(probe_cubin) -> int:
    """Where the driver says the probe's tensor map goes: 112 with nvcc 13, whose CUtensorMap is aligned to 128 in
    a parameter bank starting at 0x210 (a 64-aligned map would sit at 48); in no case the natural offset, 64."""
    cuda = loader.driver("sm90a")
    layout = cuda.param_layout(0, cuda.load(0, probe_cubin, "loader_probe", 0))
    offset, size = layout[4]
    assert size == 128 and offset != 64
    return offset


def declared_args(offset_of_map: int) -> list[dict]:
    return [*NATURAL_ARGS[:4], {**NATURAL_ARGS[4], "offset": offset_of_map},
            {**NATURAL_ARGS[5], "offset": offset_of_map + 128}]


def test_device_info_matches_torch():
    info = zyfa_kernels.device_info("sm90a", 0)
    props = torch.cuda.get_device_properties(0)
    assert info["name"] == props.name
    assert info["multiprocessors"] == props.multi_processor_count
    assert info["max_shared_bytes"] == props.shared_memory_per_block_optin
    assert info["compute_capability"] == (props.major, props.minor)


def probe_values(out_address: int, tensor_map: bytes) -> dict:
    return {"out": out_address, "n": -7, "scale": 0.375, "big": -(2**40) - 3, "map": tensor_map, "flag": 0xDEADBEEF}


def test_natural_layout_is_refused_with_the_objects_offsets(tmp_path, probe_cubin, map_offset):
    kernel = probe_kernel(tmp_path, probe_cubin, NATURAL_ARGS)
    expected = rf"map: the code object has \({map_offset}, 128\), the manifest \(64, 128\)"
    with pytest.raises(ManifestError, match=expected):
        zyfa_kernels.launch(kernel, device=0, grid=(1, 1, 1), stream=0, args=probe_values(0, bytes(128)))


def run_probe(kernel, grid, stream, tensor_map, out):
    zyfa_kernels.launch(kernel, device=0, grid=grid, stream=stream, args=probe_values(out.data_ptr(), tensor_map))


def check_records(out, grid, tensor_map):
    records = out.view(-1, RECORD_WORDS).cpu().tolist()
    map_words = list(struct.unpack("<16q", tensor_map))
    for y in range(grid[1]):
        for x in range(grid[0]):
            record = records[y * grid[0] + x]
            assert record[:3] == [x, y, THREADS]
            assert record[3] == -7 and struct.pack("<I", record[4]) == struct.pack("<f", 0.375)
            assert record[5] == -(2**40) - 3 and record[6] == 0xDEADBEEF
            assert record[7] == DYNAMIC_SHARED + 1
            assert record[8:] == map_words


def test_launch_on_torch_stream_delivers_every_argument(tmp_path, probe_cubin, map_offset):
    kernel = probe_kernel(tmp_path, probe_cubin, declared_args(map_offset))
    data = torch.zeros(4096, 128, dtype=torch.bfloat16, device="cuda")
    tensor_map = zyfa_kernels.encode_tensor_map("bf16", data.data_ptr(), [128, 4096], [256], [64, 128])
    assert any(tensor_map)
    grid = (3, 2, 1)
    out = torch.full((grid[0] * grid[1] * RECORD_WORDS,), -1, dtype=torch.int64, device="cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        run_probe(kernel, grid, stream.cuda_stream, tensor_map, out)
    stream.synchronize()
    check_records(out, grid, tensor_map)


def test_launch_is_captured_by_cuda_graphs(tmp_path, probe_cubin, map_offset):
    kernel = probe_kernel(tmp_path, probe_cubin, declared_args(map_offset))
    tensor_map = bytes(range(128))  # passed through untouched: the probe only reads its words
    grid = (2, 1, 1)
    out = torch.zeros(grid[0] * RECORD_WORDS, dtype=torch.int64, device="cuda")
    run_probe(kernel, grid, torch.cuda.current_stream().cuda_stream, tensor_map, out)  # load outside capture
    torch.cuda.synchronize()
    out.zero_()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run_probe(kernel, grid, torch.cuda.current_stream().cuda_stream, tensor_map, out)
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    check_records(out, grid, tensor_map)


def test_shared_memory_limit_and_driver_errors(tmp_path, probe_cubin, map_offset):
    limit = torch.cuda.get_device_properties(0).shared_memory_per_block_optin
    kernel = probe_kernel(tmp_path / "big", probe_cubin, declared_args(map_offset), shared_bytes=limit + 1)
    with pytest.raises(ValueError, match=f"needs {limit + 1} bytes of shared memory"):
        zyfa_kernels.launch(kernel, device=0, grid=(1, 1, 1), stream=0, args=probe_values(0, bytes(128)))
    broken = probe_kernel(tmp_path / "broken", b"\x7fELF not a cubin", declared_args(map_offset))
    with pytest.raises(DriverError, match=r"cuModuleLoadData failed with CUDA_ERROR_\w+ \(\d+\)") as error:
        zyfa_kernels.launch(broken, device=0, grid=(1, 1, 1), stream=0, args=probe_values(0, bytes(128)))
    assert error.value.call == "cuModuleLoadData" and error.value.code != 0
