"""encode_tensor_map: the fields reach cuTensorMapEncodeTiled as the driver wants them; bad requests fail first."""

from __future__ import annotations

import pytest

import zyfa_kernels

ADDRESS = 0x7F00_0000_0000
# A (batch=2, seqlen=4096, heads=8, dim=128) BF16 tensor, innermost first: dim, heads, seqlen, batch.
DIMS = [128, 8, 4096, 2]
STRIDES = [128 * 2, 8 * 128 * 2, 4096 * 8 * 128 * 2]
CU_TENSOR_MAP_DATA_TYPE_UINT8 = 0
CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 = 9


def test_fields_reach_the_driver(fake_driver):
    tensor_map = zyfa_kernels.encode_tensor_map("bf16", ADDRESS, DIMS, STRIDES, [64, 1, 128, 1], swizzle=128,
                                                l2_promotion=256)
    assert tensor_map == bytes(range(128))  # what the fake driver wrote into the map
    (call,) = fake_driver.calls("cuTensorMapEncodeTiled")
    assert call["result"] == 0 and call["map_alignment"] == 0
    assert call["data_type"] == CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 and call["rank"] == 4
    assert call["address"] == ADDRESS and call["dims"] == DIMS and call["strides"] == STRIDES
    assert call["box"] == [64, 1, 128, 1] and call["element_strides"] == [1, 1, 1, 1]
    assert (call["interleave"], call["swizzle"], call["l2_promotion"], call["oob_fill"]) == (0, 3, 3, 0)


def test_fp8_full_strides_and_torch_dtype_names(fake_driver):
    zyfa_kernels.encode_tensor_map("torch.float8_e4m3fn", ADDRESS, [128, 4096], [1, 128], [128, 64], swizzle=128,
                                   element_strides=[1, 2], oob_fill="nan", l2_promotion=0)
    (call,) = fake_driver.calls("cuTensorMapEncodeTiled")
    assert call["data_type"] == CU_TENSOR_MAP_DATA_TYPE_UINT8 and call["strides"] == [128]
    assert call["element_strides"] == [1, 2] and call["oob_fill"] == 1 and call["l2_promotion"] == 0


def test_driver_failure_is_a_driver_error(fake_driver, monkeypatch):
    monkeypatch.setenv("ZYFA_FAKE_DRIVER_FAIL", "cuTensorMapEncodeTiled:1")
    with pytest.raises(zyfa_kernels.DriverError, match=r"cuTensorMapEncodeTiled failed with "
                                                       r"CUDA_ERROR_INVALID_VALUE \(1\)"):
        zyfa_kernels.encode_tensor_map("bf16", ADDRESS, DIMS, STRIDES, [64, 1, 128, 1])


@pytest.mark.parametrize("change, message", [
    ({"dtype": "fp16x"}, "dtype='fp16x' is not one of"),
    ({"global_address": ADDRESS + 8}, "must be 16-byte aligned"),
    ({"strides_bytes": [256, 4104, 8 * 4096 * 256]}, "must be multiples of 16"),
    ({"strides_bytes": [256, 4096]}, "strides_bytes needs 3 entries"),
    ({"strides_bytes": [4, 256, 4096, 8 * 4096 * 256]}, "innermost dimension must be dense"),
    ({"box_dims": [64, 1, 512, 1]}, r"box_dims\[2\] = 512 must be an integer in \[1, 256\]"),
    ({"box_dims": [128, 1, 64, 1]}, "inner box is 256 bytes, more than the 128-byte swizzle span"),
    ({"box_dims": [4, 1, 64, 1], "swizzle": 0}, "inner box is 8 bytes; without interleave it must be a multiple"),
    ({"swizzle": 256}, "swizzle=256 is not one of"),
    ({"dims": [0, 8, 4096, 2]}, r"dims\[0\] = 0"),
    ({"dims": [1] * 6, "strides_bytes": [16] * 5, "box_dims": [8] * 6}, "rank must be 1 to 5"),
    ({"element_strides": [1, 1, 9, 1]}, r"element_strides\[2\] = 9"),
])
def test_bad_requests_fail_before_the_driver(fake_driver, change, message):
    request = {"dtype": "bf16", "global_address": ADDRESS, "dims": DIMS, "strides_bytes": STRIDES,
               "box_dims": [64, 1, 128, 1], **change}
    with pytest.raises(ValueError, match=message):
        zyfa_kernels.encode_tensor_map(**request)
    assert fake_driver.calls() == []
