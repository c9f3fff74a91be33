"""The manifest: fields, lookup, hash-checked images, and the errors for malformed files."""

from __future__ import annotations

import json

import pytest

import zyfa_kernels
from zyfa_kernels import KernelNotFound, ManifestError
from zyfa_kernels.manifest import MANIFEST_PATH
from zyfa_kernels.testing import fake_image, write_manifest


def test_fields_are_attributes(test_manifest):
    kernel = test_manifest.find("sm90a", dtype="bf16", d_qk=128)
    assert (kernel.name, kernel.tile_m, kernel.threads, kernel.grid) == ("test_sm90a", 128, 384, "persistent")
    assert kernel.args[4] == {"name": "tmap_k", "type": "tmap"}
    assert kernel.fields["scale_block"] is None
    with pytest.raises(AttributeError, match="no field 'tile_k'"):
        kernel.tile_k  # noqa: B018


def test_find_filters_by_target_and_fields(tmp_path, make_entry, example_image):
    path = write_manifest(tmp_path, [
        (make_entry("gfx950", "bf16_d128"), example_image),
        (make_entry("gfx950", "fp8_d128", dtype="fp8e4m3", p_mode="lean", scale_block=64), example_image),
        (make_entry("gfx950", "fp8_d192", dtype="fp8e4m3", d_qk=192, p_mode="exact", scale_block=64), example_image),
    ])
    manifest = zyfa_kernels.manifest(path)
    assert manifest.find("gfx950", dtype="fp8e4m3", d_qk=192).name == "fp8_d192"
    assert manifest.find("gfx950", dtype="bf16").name == "bf16_d128"
    with pytest.raises(KernelNotFound) as missing:
        manifest.find("gfx950", dtype="fp8e4m3", d_qk=256)
    assert isinstance(missing.value, KeyError)
    text = str(missing.value)
    assert "no kernel matches target='gfx950' dtype='fp8e4m3', d_qk=256" in text
    assert "gfx950/fp8_d128: dtype=fp8e4m3 d_qk=128" in text and "gfx950/fp8_d192" in text
    with pytest.raises(KernelNotFound, match="2 kernels match"):
        manifest.find("gfx950", dtype="fp8e4m3")
    with pytest.raises(KernelNotFound, match=r"the sm90a kernels are:\n  \(none\)"):
        manifest.find("sm90a", dtype="bf16")


def test_image_is_read_and_hash_checked(test_manifest, example_image):
    kernel = test_manifest.find("sm90a")
    assert kernel.image() == example_image
    (kernel._root / kernel.file).write_bytes(example_image + b" tampered")
    with pytest.raises(ManifestError, match="has sha256 .* the manifest records"):
        kernel.image()
    (kernel._root / kernel.file).unlink()
    with pytest.raises(ManifestError, match="cannot read its code object"):
        kernel.image()


def test_missing_fields_are_named(tmp_path, make_entry, example_image):
    entry = make_entry("sm90a", "k")
    del entry["threads"], entry["args"]
    manifest = zyfa_kernels.manifest(write_manifest(tmp_path, [(entry, example_image)]))
    assert manifest.invalid == {"k": "kernel k: missing fields ['threads', 'args']"}
    with pytest.raises(ManifestError, match=r"kernel k: missing fields \['threads', 'args'\]"):
        manifest.check()


@pytest.mark.parametrize("overrides, message", [
    ({"target": "sm100"}, "target must be one of ['sm90a', 'gfx950'], got 'sm100'"),
    ({"shared_bytes": -1}, "shared_bytes must be an integer >= 0, got -1"),
    ({"threads": 0}, "threads must be an integer >= 1, got 0"),
    ({"tile_m": 0}, "tile_m must be an integer >= 1, got 0"),
    ({"tile_n": True}, "tile_n must be an integer >= 1, got True"),
    ({"grid_size": 0}, "grid_size must be an integer >= 1, got 0"),
    ({"d_qk": "128"}, "d_qk must be an integer >= 1, got '128'"),
    ({"p_mode": "fast"}, "p_mode must be one of ['bf16', 'lean', 'exact'], got 'fast'"),
    ({"p_mode": "lean"}, "p_mode 'lean' does not fit dtype 'bf16'"),
    ({"dtype": "fp8e4m3"}, "p_mode 'bf16' does not fit dtype 'fp8e4m3'"),
    ({"p_mode_default": 1}, "p_mode_default must be true or false, got 1"),
    ({"p_shift": 8}, "p_shift must be 0 and scale_block null for dtype 'bf16'"),
    ({"rowsum": "fp16"}, "rowsum must be one of ['rounded', 'fp32'], got 'fp16'"),
    ({"rescale_threshold": float("nan")}, "rescale_threshold must be a finite number >= 0, got nan"),
    ({"scale_block": 0}, "scale_block must be null or an integer >= 1, got 0"),
    ({"seqlen_min": 4096, "seqlen_max": 4096}, "seqlen_min 4096 must be below seqlen_max 4096"),
    ({"offset_bits": 48}, "offset_bits must be one of [32, 64], got 48"),
    ({"masks_tail": None}, "masks_tail must be true or false, got None"),
    ({"sha256": "00"}, "sha256 must be 64 lowercase hex digits"),
    ({"resources": []}, "resources must be an object, got []"),
    ({"args": {"q": "ptr"}}, "args must be a list"),
    ({"resources": {"static_shared_bytes": 8192}}, "static_shared_bytes = 8192 must be an integer between 0 and"),
    ({"args": [{"name": "x", "type": "half"}]}, "argument 'x' has type 'half'"),
    ({"resources": {"kernarg_size": 64}}, "declared argument size 64 is smaller than the arguments (192 bytes)"),
    ({"layout": "bshd"}, "fields ['layout'] are reserved for the loader"),
])
def test_malformed_entries(tmp_path, make_entry, example_image, overrides, message):
    """A bad entry is left out with an error naming it and the field; the other entries stay usable, and a lookup
    that finds nothing says which entry was left out and why (no ZeroDivisionError or bare KernelNotFound later)."""
    bad = {**make_entry("gfx950", "k"), **overrides}
    good = make_entry("gfx950", "other", d_qk=192)
    path = write_manifest(tmp_path, [(bad, example_image), (good, example_image)])
    manifest = zyfa_kernels.manifest(path)
    if overrides.get("sha256"):  # write_manifest fills sha256 in: break it in the file
        data = json.loads(path.read_text())
        data["kernels"][0]["sha256"] = overrides["sha256"]
        path.write_text(json.dumps(data))
        manifest = zyfa_kernels.manifest(path)
    assert [k.name for k in manifest.kernels] == ["other"]
    assert list(manifest.invalid) == ["k"] and manifest.invalid["k"].startswith("kernel k: ")
    assert message in manifest.invalid["k"]
    assert manifest.find("gfx950", d_qk=192).name == "other"
    with pytest.raises(KernelNotFound, match="left out as invalid") as missing:
        manifest.find("gfx950", d_qk=128)
    assert "kernel k: " in str(missing.value)
    with pytest.raises(ManifestError, match="kernel k: "):
        manifest.check()


def test_version_and_duplicates_are_checked(tmp_path, make_entry, example_image):
    path = write_manifest(tmp_path, [(make_entry("sm90a", "k"), example_image)], version="0.0.9")
    with pytest.raises(ManifestError, match="version '0.0.9' does not match zyfa-kernels 0.1.0"):
        zyfa_kernels.manifest(path)
    path = write_manifest(tmp_path, [(make_entry("sm90a", "k"), example_image)] * 2)
    with pytest.raises(ManifestError, match="sm90a/k appears twice"):
        zyfa_kernels.manifest(path)
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(ManifestError, match="cannot read the manifest"):
        zyfa_kernels.manifest(tmp_path / "manifest.json")


def test_static_shared_memory_is_not_passed_again(tmp_path, make_entry):
    image = fake_image("zyfa_test_fwd")
    entry = make_entry("gfx950", "k", shared_bytes=163840, resources={"static_shared_bytes": 163840})
    kernel = zyfa_kernels.manifest(write_manifest(tmp_path, [(entry, image)])).find("gfx950")
    assert kernel.dynamic_shared_bytes == 0


def test_packaged_manifest_is_consistent():
    """The manifest shipped in the package (written by asmgen.build) loads and every object matches its hash."""
    if not MANIFEST_PATH.exists():
        with pytest.raises(ManifestError, match="asmgen.build"):
            zyfa_kernels.manifest()
        return
    manifest = zyfa_kernels.manifest().check()
    assert manifest.version == zyfa_kernels.__version__
    assert json.loads(MANIFEST_PATH.read_text())["kernels"] == [k.fields for k in manifest.objects]
    assert manifest.kernels == [k for k in manifest.objects if k.kind == "attention"] != manifest.objects
    for kernel in manifest.objects:
        assert kernel.image()


def transpose_entry(**overrides) -> dict:
    entry = {"kind": "transpose_v", "name": "t", "symbol": "t", "file": "t.bin", "dtype": "fp8e4m3", "d_v": 128,
             "tile_keys": 128, "key_group": 16, "threads": 256, "shared_bytes": 17408, "target": "sm90a",
             "args": [{"name": "v", "type": "ptr"}], "resources": {"static_shared_bytes": 17408}}
    return {**entry, **overrides}


@pytest.mark.parametrize(("overrides", "message"), [
    ({}, None),
    ({"kind": "gather"}, "kind must be one of \\['transpose_v'\\]"),
    ({"tile_keys": 0}, "tile_keys must be an integer >= 1, got 0"),
    ({"key_group": 24}, "key_group 24 must divide tile_keys 128"),
    ({"dtype": "bf16"}, "dtype must be one of \\['fp8e4m3'\\]"),
    ({"resources": {"static_shared_bytes": 20000}}, "static_shared_bytes = 20000 must be an integer between 0"),
])
def test_entries_of_another_kind_have_rules_of_their_own(tmp_path, make_entry, example_image, overrides, message):
    """A transpose_v entry is validated by its kind's fields (an attention entry's are not asked of it); it is kept
    out of `kernels` (what dispatch chooses from) and found with find(kind=...)."""
    entry = transpose_entry(**overrides)
    path = write_manifest(tmp_path, [(make_entry("sm90a", "a"), example_image), (entry, fake_image("t"))])
    m = zyfa_kernels.manifest(path)
    if message is None:
        assert not m.invalid and [k.name for k in m.kernels] == ["a"] and len(m.objects) == 2
        found = m.find("sm90a", kind="transpose_v", d_v=128)
        assert found.kind == "transpose_v" and found.tile_keys == 128 and "kind=transpose_v" in found.variant()
        with pytest.raises(KernelNotFound):
            m.find("sm90a", name="t")  # not an attention kernel
    else:
        assert [k.name for k in m.objects] == ["a"]
        with pytest.raises(ManifestError, match=message):
            m.check()
