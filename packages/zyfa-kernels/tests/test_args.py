"""Argument buffers: natural alignment, declared offsets, and the errors for wrong values."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from zyfa_kernels.args import ARG_TYPES, ArgLayout


def test_natural_alignment_of_mixed_arguments(example_args):
    layout = ArgLayout.from_manifest(example_args)
    assert layout.offsets == (0, 8, 12, 16, 64)
    assert layout.size == 192


def test_pack_matches_a_c_struct_of_the_same_members(example_args, example_values):
    layout = ArgLayout.from_manifest(example_args)
    expected = bytearray(192)
    struct.pack_into("<QifQ", expected, 0, example_values["q"], example_values["seqlen"], example_values["scale"],
                     example_values["jobs"] & (2**64 - 1))
    expected[64:192] = example_values["tmap_k"]
    assert layout.pack(example_values) == bytes(expected)


def test_padding_between_arguments_and_none_after():
    layout = ArgLayout.from_manifest([{"name": "n", "type": "i32"}, {"name": "p", "type": "ptr"},
                                      {"name": "m", "type": "u32"}])
    assert layout.offsets == (0, 8, 16)
    assert layout.size == 20
    assert layout.pack({"n": -1, "p": 2, "m": 3}) == struct.pack("<i4xQI", -1, 2, 3)


def test_declared_offsets_are_followed():
    # nvcc places a by-value CUtensorMap so that its address in the sm_90 parameter bank is 128-byte aligned.
    args = [{"name": "p", "type": "ptr", "offset": 0}, {"name": "n", "type": "i32", "offset": 8},
            {"name": "m", "type": "tmap", "offset": 112}, {"name": "f", "type": "f32", "offset": 240}]
    layout = ArgLayout.from_manifest(args)
    assert layout.offsets == (0, 8, 112, 240)
    packed = layout.pack({"p": 1, "n": 2, "m": bytes([7]) * 128, "f": 1.5})
    assert packed[112:240] == bytes([7]) * 128
    assert struct.unpack_from("<f", packed, 240) == (1.5,)


def test_overlapping_declared_offset_is_refused():
    with pytest.raises(ValueError, match="'n' has offset 4"):
        ArgLayout.from_manifest([{"name": "p", "type": "ptr"}, {"name": "n", "type": "i32", "offset": 4}])


@pytest.mark.parametrize("args, message", [
    ([{"name": "x", "type": "f16"}], "type 'f16'"),
    ([{"name": "", "type": "ptr"}], "non-empty string 'name'"),
    ([{"name": "x", "type": "ptr"}, {"name": "x", "type": "i32"}], "'x' appears twice"),
])
def test_malformed_argument_lists(args, message):
    with pytest.raises(ValueError, match=message):
        ArgLayout.from_manifest(args)


def test_missing_and_unexpected_names_are_reported(example_args, example_values):
    layout = ArgLayout.from_manifest(example_args)
    values = dict(example_values)
    del values["seqlen"]
    values["seq_len"] = 1
    with pytest.raises(ValueError, match=r"missing \['seqlen'\] and unexpected \['seq_len'\]"):
        layout.pack(values, "k")


@pytest.mark.parametrize("name, value, error, message", [
    ("q", 1.0, TypeError, "'q' \\(ptr\\) must be an int"),
    ("q", -1, ValueError, "outside the ptr range"),
    ("seqlen", 2**31, ValueError, "outside the i32 range"),
    ("seqlen", True, TypeError, "not bool"),
    ("jobs", 2**63, ValueError, "outside the i64 range"),
    ("scale", "0.5", TypeError, "'scale' \\(f32\\) must be a float"),
    ("scale", 1e39, ValueError, "overflows f32"),
    ("tmap_k", bytes(64), TypeError, "must be 128 bytes"),
])
def test_wrong_values_name_the_argument(name, value, error, message, example_args, example_values):
    layout = ArgLayout.from_manifest(example_args)
    with pytest.raises(error, match=message):
        layout.pack({**example_values, name: value})


def test_u32_range_and_integer_f32():
    layout = ArgLayout.from_manifest([{"name": "u", "type": "u32"}, {"name": "f", "type": "f32"}])
    assert layout.pack({"u": 2**32 - 1, "f": 2}) == struct.pack("<If", 2**32 - 1, 2.0)
    with pytest.raises(ValueError, match="outside the u32 range"):
        layout.pack({"u": -1, "f": 2})


@given(st.lists(st.sampled_from(sorted(ARG_TYPES)), min_size=1, max_size=12))
def test_any_argument_list_packs_aligned_and_round_trips(kinds):
    args = [{"name": f"a{i}", "type": kind} for i, kind in enumerate(kinds)]
    layout = ArgLayout.from_manifest(args)
    ends = 0
    for offset, kind in zip(layout.offsets, kinds, strict=True):
        assert offset % ARG_TYPES[kind].align == 0 and offset >= ends
        ends = offset + ARG_TYPES[kind].size
    assert layout.size == ends
    values = {f"a{i}": (bytes([i]) * 128 if kind == "tmap" else 0.5 if kind == "f32" else i + 1)
              for i, kind in enumerate(kinds)}
    packed = layout.pack(values)
    for i, (offset, kind) in enumerate(zip(layout.offsets, kinds, strict=True)):
        (read,) = struct.unpack_from("<" + ARG_TYPES[kind].code, packed, offset)
        assert read == values[f"a{i}"]


def test_declared_segment_size_pads_the_buffer():
    args = [{"name": "p", "type": "ptr"}, {"name": "n", "type": "i32"}]
    layout = ArgLayout.from_manifest(args, size=16)
    assert layout.size == 16 and layout.pack({"p": 1, "n": 2}) == struct.pack("<Qi4x", 1, 2)
    with pytest.raises(ValueError, match="declared argument size 8 is smaller than the arguments \\(12 bytes\\)"):
        ArgLayout.from_manifest(args, "k", size=8)
