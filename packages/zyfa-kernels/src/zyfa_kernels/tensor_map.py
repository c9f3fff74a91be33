"""CUDA tensor maps (TMA descriptors) for sm90a kernel arguments, encoded by the driver's cuTensorMapEncodeTiled.

Dimensions and strides are innermost first, as the driver takes them. The rules checked here are the driver's
documented ones, so a bad request fails with the argument named instead of CUDA_ERROR_INVALID_VALUE.
"""

from __future__ import annotations

from collections.abc import Sequence

# CUtensorMapDataType values, by ZYFA's short names and by torch's dtype names; FP8 travels as bytes.
DATA_TYPES = {
    "u8": (0, 1), "uint8": (0, 1), "fp8e4m3": (0, 1), "float8_e4m3fn": (0, 1),
    "u16": (1, 2), "uint16": (1, 2),
    "u32": (2, 4), "uint32": (2, 4),
    "i32": (3, 4), "int32": (3, 4),
    "u64": (4, 8), "uint64": (4, 8),
    "i64": (5, 8), "int64": (5, 8),
    "f16": (6, 2), "float16": (6, 2),
    "f32": (7, 4), "float32": (7, 4),
    "f64": (8, 8), "float64": (8, 8),
    "bf16": (9, 2), "bfloat16": (9, 2),
}
SWIZZLES = {0: 0, 32: 1, 64: 2, 128: 3}  # swizzle span in bytes -> CUtensorMapSwizzle
INTERLEAVES = {0: 0, 16: 1, 32: 2}  # interleave in bytes -> CUtensorMapInterleave
L2_PROMOTIONS = {0: 0, 64: 1, 128: 2, 256: 3}  # bytes -> CUtensorMapL2promotion
OOB_FILLS = {"zero": 0, "nan": 1}  # CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE fills zeros; NAN_REQUEST_ZERO_FMA fills NaN
MAX_RANK = 5
MAX_BOX = 256
MAX_ELEMENT_STRIDE = 8
GLOBAL_ALIGN = 16  # bytes, for the address and every stride
MAX_STRIDE = 2**40
MAX_DIM = 2**32


def _enum(table: dict, value, what: str) -> int:
    if value not in table:
        raise ValueError(f"encode_tensor_map: {what}={value!r} is not one of {list(table)}")
    return table[value]


def _ints(values: Sequence[int], what: str, low: int, high: int) -> list[int]:
    out = []
    for i, v in enumerate(values):
        if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
            raise ValueError(f"encode_tensor_map: {what}[{i}] = {v!r} must be an integer in [{low}, {high}]")
        out.append(v)
    return out


def tensor_map_request(dtype, global_address: int, dims: Sequence[int], strides_bytes: Sequence[int],
                       box_dims: Sequence[int], *, swizzle: int = 128, element_strides: Sequence[int] | None = None,
                       interleave: int = 0, l2_promotion: int = 128, oob_fill: str = "zero") -> dict:
    """Check a tensor map request and return the driver's arguments (see encode_tensor_map)."""
    name = str(dtype).removeprefix("torch.")
    data_type, element_bytes = _enum(DATA_TYPES, name, "dtype")
    rank = len(dims)
    if not 1 <= rank <= MAX_RANK:
        raise ValueError(f"encode_tensor_map: dims has {rank} entries; the rank must be 1 to {MAX_RANK}")
    dims = _ints(dims, "dims", 1, MAX_DIM)
    if len(strides_bytes) == rank:  # the full stride list: dimension 0 must be dense, the driver omits it
        if strides_bytes[0] != element_bytes:
            raise ValueError(f"encode_tensor_map: strides_bytes[0] = {strides_bytes[0]} but the innermost dimension "
                             f"must be dense ({element_bytes} bytes for {name})")
        strides_bytes = strides_bytes[1:]
    if len(strides_bytes) != rank - 1:
        raise ValueError(f"encode_tensor_map: strides_bytes needs {rank - 1} entries (dimensions 1..{rank - 1}), "
                         f"got {len(strides_bytes)}")
    strides = _ints(strides_bytes, "strides_bytes", GLOBAL_ALIGN, MAX_STRIDE - 1)
    if any(s % GLOBAL_ALIGN for s in strides):
        raise ValueError(f"encode_tensor_map: strides_bytes {strides} must be multiples of {GLOBAL_ALIGN}")
    if len(box_dims) != rank:
        raise ValueError(f"encode_tensor_map: box_dims needs {rank} entries, got {len(box_dims)}")
    box = _ints(box_dims, "box_dims", 1, MAX_BOX)
    element_strides = [1] * rank if element_strides is None else element_strides
    if len(element_strides) != rank:
        raise ValueError(f"encode_tensor_map: element_strides needs {rank} entries, got {len(element_strides)}")
    element_strides = _ints(element_strides, "element_strides", 1, MAX_ELEMENT_STRIDE)
    interleave_value = _enum(INTERLEAVES, interleave, "interleave")
    swizzle_value = _enum(SWIZZLES, swizzle, "swizzle")
    if isinstance(global_address, bool) or not isinstance(global_address, int) or global_address <= 0:
        raise ValueError(f"encode_tensor_map: global_address must be a positive integer, got {global_address!r}")
    if global_address % max(GLOBAL_ALIGN, interleave):
        raise ValueError(f"encode_tensor_map: global_address {global_address:#x} must be "
                         f"{max(GLOBAL_ALIGN, interleave)}-byte aligned")
    inner_bytes = box[0] * element_bytes
    if interleave == 0 and inner_bytes % GLOBAL_ALIGN:
        raise ValueError(f"encode_tensor_map: the inner box is {inner_bytes} bytes; without interleave it must be "
                         f"a multiple of {GLOBAL_ALIGN}")
    if interleave == 0 and swizzle and inner_bytes > swizzle:
        raise ValueError(f"encode_tensor_map: the inner box is {inner_bytes} bytes, more than the {swizzle}-byte "
                         f"swizzle span")
    return {
        "data_type": data_type,
        "address": global_address,
        "dims": dims,
        "strides_bytes": strides,
        "box_dims": box,
        "element_strides": element_strides,
        "interleave": interleave_value,
        "swizzle": swizzle_value,
        "l2_promotion": _enum(L2_PROMOTIONS, l2_promotion, "l2_promotion"),
        "oob_fill": _enum(OOB_FILLS, oob_fill, "oob_fill"),
    }

