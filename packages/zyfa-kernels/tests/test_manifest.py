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
    path = write_manifest(tmp_path, [(entry, example_image)])
    with pytest.raises(ManifestError, match=r"kernel k: missing fields \['threads', 'args'\]"):
        zyfa_kernels.manifest(path)


@pytest.mark.parametrize("overrides, message", [
    ({"target": "sm100"}, "target 'sm100' is not one of"),
    ({"shared_bytes": -1}, "shared_bytes must be an integer >= 0"),
    ({"threads": 0}, "threads must be an integer >= 1"),
    ({"resources": []}, "resources must be an object and args a list"),
    ({"args": {"q": "ptr"}}, "resources must be an object and args a list"),
    ({"resources": {"static_shared_bytes": 8192}}, "static_shared_bytes = 8192 must be an integer between 0 and"),
    ({"args": [{"name": "x", "type": "half"}]}, "argument 'x' has type 'half'"),
    ({"resources": {"kernarg_size": 64}}, r"declared argument size 64 is smaller than the arguments \(192 bytes\)"),
    ({"layout": "bshd"}, r"fields \['layout'\] are reserved for the loader"),
])
def test_malformed_entries(tmp_path, make_entry, example_image, overrides, message):
    entry = {**make_entry("gfx950", "k"), **overrides}
    path = write_manifest(tmp_path, [(entry, example_image)])
    with pytest.raises(ManifestError, match=message):
        zyfa_kernels.manifest(path)


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
    manifest = zyfa_kernels.manifest()
    assert manifest.version == zyfa_kernels.__version__
    assert json.loads(MANIFEST_PATH.read_text())["kernels"] == [k.fields for k in manifest.kernels]
    for kernel in manifest.kernels:
        assert kernel.image()
