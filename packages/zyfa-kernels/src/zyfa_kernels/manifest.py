"""The manifest: one entry per code object in the package, read by the loader and by zyfa's kernel dispatch.

    {"version": "0.1.0", "kernels": [entry, ...]}

An entry is the target module's kernel description plus what the build adds (target, file, sha256, resources);
docs/loader.md lists the fields. `Kernel` exposes every field as an attribute.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

from .args import ArgLayout
from .errors import KernelNotFound, ManifestError

PACKAGE_DIR = Path(__file__).resolve().parent
MANIFEST_PATH = PACKAGE_DIR / "manifest.json"
TARGETS = ("sm90a", "gfx950")
REQUIRED_FIELDS = (
    "name", "symbol", "target", "file", "sha256", "dtype", "d_qk", "d_v", "p_mode", "tile_m", "tile_n",
    "scale_block", "rescale_threshold", "threads", "shared_bytes", "grid", "args", "resources",
)
# Shared memory the code object declares itself (static LDS on gfx950, static __shared__ on sm90a), reported
# by the build's inspect step; the launch passes only the rest of shared_bytes as dynamic shared memory.
STATIC_SHARED_RESOURCE = "static_shared_bytes"
# The argument segment size the code object declares, if it does (inspect reports it for gfx950).
KERNARG_SIZE_RESOURCE = "kernarg_size"
# Attributes a Kernel adds to its manifest fields.
DERIVED_ATTRIBUTES = frozenset({"layout", "dynamic_shared_bytes", "fields", "image", "variant"})


class Kernel:
    """One code object of the manifest. Fields are attributes (`kernel.tile_m`); `image()` reads the object."""

    def __init__(self, entry: dict, root: Path):
        missing = [field for field in REQUIRED_FIELDS if field not in entry]
        label = entry.get("name", "<unnamed>")
        if missing:
            raise ManifestError(f"kernel {label}: missing fields {missing}")
        if entry["target"] not in TARGETS:
            raise ManifestError(f"kernel {label}: target {entry['target']!r} is not one of {TARGETS}")
        for field, least in (("threads", 1), ("shared_bytes", 0)):
            if type(entry[field]) is not int or entry[field] < least:
                raise ManifestError(f"kernel {label}: {field} must be an integer >= {least}, got {entry[field]!r}")
        if not isinstance(entry["resources"], dict) or not isinstance(entry["args"], list):
            raise ManifestError(f"kernel {label}: resources must be an object and args a list")
        static = entry["resources"].get(STATIC_SHARED_RESOURCE, 0)
        if not isinstance(static, int) or not 0 <= static <= entry["shared_bytes"]:
            raise ManifestError(f"kernel {label}: resources.{STATIC_SHARED_RESOURCE} = {static!r} must be an "
                                f"integer between 0 and shared_bytes ({entry['shared_bytes']})")
        try:
            layout = ArgLayout.from_manifest(entry["args"], label, entry["resources"].get(KERNARG_SIZE_RESOURCE))
        except ValueError as error:
            raise ManifestError(str(error)) from None
        clashes = sorted(set(entry) & DERIVED_ATTRIBUTES)
        if clashes:
            raise ManifestError(f"kernel {label}: fields {clashes} are reserved for the loader")
        self.__dict__.update(entry)  # plain attributes: launches read several per call
        self._entry = dict(entry)
        self._root = root
        self.layout = layout
        self.dynamic_shared_bytes = entry["shared_bytes"] - static

    def __getattr__(self, field: str):  # reached only for names that are not fields
        raise AttributeError(f"kernel {self.__dict__.get('name')} has no field {field!r}")

    @property
    def fields(self) -> dict:
        """A copy of the manifest entry."""
        return dict(self._entry)

    def image(self) -> bytes:
        """The code object's bytes, checked against the manifest's sha256."""
        path = self._root / self.file
        try:
            data = path.read_bytes()
        except OSError as error:
            raise ManifestError(f"kernel {self.name}: cannot read its code object {path}: {error}") from None
        digest = hashlib.sha256(data).hexdigest()
        if digest != self.sha256:
            raise ManifestError(f"kernel {self.name}: {self.file} has sha256 {digest}, the manifest records "
                                f"{self.sha256}; rebuild with `python -m asmgen.build`")
        return data

    def variant(self) -> str:
        """A one-line description of the fields kernels are chosen by."""
        return (f"{self.target}/{self.name}: dtype={self.dtype} d_qk={self.d_qk} d_v={self.d_v} "
                f"p_mode={self.p_mode} tile_m={self.tile_m} tile_n={self.tile_n}")

    def __repr__(self) -> str:
        return f"Kernel({self.variant()})"


class Manifest:
    """Every kernel of one manifest file; code object paths are relative to the file's folder."""

    def __init__(self, data: dict, root: Path, source: str = "manifest"):
        from . import __version__

        if not isinstance(data, dict) or not isinstance(data.get("kernels"), list):
            raise ManifestError(f"{source}: expected an object with a 'kernels' list")
        if data.get("version") != __version__:
            raise ManifestError(f"{source}: version {data.get('version')!r} does not match zyfa-kernels "
                                f"{__version__}; rebuild the objects with `python -m asmgen.build`")
        self.version = data["version"]
        self.kernels = [Kernel(entry, root) for entry in data["kernels"]]
        seen = set()
        for kernel in self.kernels:
            if (kernel.target, kernel.name) in seen:
                raise ManifestError(f"{source}: kernel {kernel.target}/{kernel.name} appears twice")
            seen.add((kernel.target, kernel.name))

    @classmethod
    def from_file(cls, path: str | Path) -> Manifest:
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as error:
            raise ManifestError(f"cannot read the manifest {path}: {error}") from None
        return cls(data, path.resolve().parent, str(path))

    def find(self, target: str, **fields) -> Kernel:
        """The one kernel of `target` whose fields equal `fields`; KernelNotFound (a KeyError) lists the variants."""
        candidates = [k for k in self.kernels if k.target == target]
        matches = [k for k in candidates if all(k.fields.get(f, _ABSENT) == v for f, v in fields.items())]
        if len(matches) == 1:
            return matches[0]
        wanted = ", ".join(f"{f}={v!r}" for f, v in fields.items())
        listing = "\n  ".join(k.variant() for k in candidates) or "(none)"
        problem = "no kernel matches" if not matches else f"{len(matches)} kernels match"
        raise KernelNotFound(f"{problem} target={target!r} {wanted}; the {target} kernels are:\n  {listing}")


_ABSENT = object()


@functools.cache
def _packaged() -> Manifest:
    if not MANIFEST_PATH.exists():
        raise ManifestError(f"{MANIFEST_PATH} is missing: the package was built without its code objects "
                            f"(`python -m asmgen.build` writes them)")
    return Manifest.from_file(MANIFEST_PATH)


def manifest(path: str | Path | None = None) -> Manifest:
    """The package's manifest (read once), or the manifest file at `path`."""
    return _packaged() if path is None else Manifest.from_file(path)
