"""The manifest: one entry per code object in the package, read by the loader and by zyfa's kernel dispatch.

    {"version": "0.1.0", "kernels": [entry, ...]}

An entry is the target module's kernel description plus what the build adds (target, file, sha256, resources);
docs/loader.md lists the fields. `Kernel` exposes every field as an attribute. An entry without "kind" is an
attention kernel; "kind": "transpose_v" is the sm90a FP8 V^T pre-pass, with fields of its own (KIND_FIELD_RULES).
`Manifest.kernels` holds the attention kernels (what dispatch and the support matrix choose from),
`Manifest.objects` every entry of every kind.

Each entry is validated when the manifest is read. A malformed entry is left out and recorded in
`Manifest.invalid` (kernel -> the error naming the field); every other entry stays usable, and a lookup that finds
no kernel lists the entries left out with their errors, so the one bad entry explains itself where it matters.
A file that cannot be read, a wrong version or a duplicated name fail the whole manifest. This module imports no
native code: the CPU path reads the manifest without loading the driver extension.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import numbers
from pathlib import Path

from .args import ArgLayout
from .errors import KernelNotFound, ManifestError

PACKAGE_DIR = Path(__file__).resolve().parent
MANIFEST_PATH = PACKAGE_DIR / "manifest.json"
TARGETS = ("sm90a", "gfx950")
DTYPES = ("bf16", "fp8e4m3")
P_MODES = {"bf16": ("bf16",), "fp8e4m3": ("lean", "exact")}  # dtype -> the probability formats it may use
ROWSUMS = ("rounded", "fp32")
GRIDS = ("persistent",)
OFFSET_BITS = (32, 64)
# Shared memory the code object declares itself (static LDS on gfx950, static __shared__ on sm90a), reported
# by the build's inspect step; the launch passes only the rest of shared_bytes as dynamic shared memory.
STATIC_SHARED_RESOURCE = "static_shared_bytes"
# The argument segment size the code object declares, if it does (inspect reports it for gfx950).
KERNARG_SIZE_RESOURCE = "kernarg_size"
# Attributes a Kernel adds to its manifest fields.
DERIVED_ATTRIBUTES = frozenset({"layout", "dynamic_shared_bytes", "fields", "image", "variant", "serves"})


def _int(least: int):
    def check(value):
        if type(value) is not int or value < least:
            return f"must be an integer >= {least}"
        return None
    return check


def _optional_int(least: int):
    inner = _int(least)
    return lambda value: None if value is None else inner(value) and f"must be null or an integer >= {least}"


def _one_of(choices):
    return lambda value: None if type(value) in (str, int) and value in choices else f"must be one of {list(choices)}"


def _string(value):
    return None if isinstance(value, str) and value else "must be a non-empty string"


def _bool(value):
    return None if type(value) is bool else "must be true or false"


def _real(value):
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
    return None if ok else "must be a finite number >= 0"


def _sha256(value):
    ok = isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)
    return None if ok else "must be 64 lowercase hex digits"


# Every field an entry must have, with its rule (a function returning None or what is wrong).
FIELD_RULES = {
    "name": _string, "symbol": _string, "target": _one_of(TARGETS), "file": _string, "sha256": _sha256,
    "dtype": _one_of(DTYPES), "d_qk": _int(1), "d_v": _int(1),
    "p_mode": _one_of(("bf16", "lean", "exact")), "p_mode_default": _bool, "p_shift": _int(0),
    "rescale_threshold": _real, "scale_block": _optional_int(1), "rowsum": _one_of(ROWSUMS),
    "tile_m": _int(1), "tile_n": _int(1), "schedule": _string,
    "seqlen_min": _optional_int(1), "seqlen_max": _optional_int(1), "offset_bits": _one_of(OFFSET_BITS),
    "masks_tail": _bool, "threads": _int(1), "shared_bytes": _int(0), "grid": _one_of(GRIDS),
    "args": lambda value: None if isinstance(value, list) else "must be a list",
    "resources": lambda value: None if isinstance(value, dict) else "must be an object",
}
REQUIRED_FIELDS = tuple(FIELD_RULES)
OPTIONAL_FIELD_RULES = {"grid_size": _int(1)}  # gfx950: the persistent grid's fixed size
ATTENTION = "attention"  # the kind of an entry without "kind"
# The other kinds: every field each must have, with its rule.
KIND_FIELD_RULES = {
    "transpose_v": {  # FP8 V (batch, seqlen, heads_k, d_v) -> V^T (batch, heads_k, d_v, keys), keys permuted
        **{field: FIELD_RULES[field] for field in ("name", "symbol", "target", "file", "sha256", "threads",
                                                     "shared_bytes", "args", "resources")},
        "kind": _one_of(("transpose_v",)), "dtype": _one_of(("fp8e4m3",)), "d_v": _int(1),
        "tile_keys": _int(1), "key_group": _int(1),
    },
}
KINDS = (ATTENTION, *KIND_FIELD_RULES)


def validate_entry(entry) -> str | None:
    """What is wrong with one manifest entry (the first problem, naming the field), or None."""
    if not isinstance(entry, dict):
        return f"an entry must be an object, got {type(entry).__name__}"
    if "kind" in entry:
        return _validate_kind(entry)
    missing = [field for field in REQUIRED_FIELDS if field not in entry]
    if missing:
        return f"missing fields {missing}"
    for rules in (FIELD_RULES, OPTIONAL_FIELD_RULES):
        for field, rule in rules.items():
            if field in entry:
                problem = rule(entry[field])
                if problem:
                    return f"{field} {problem}, got {entry[field]!r}"
    if entry["p_mode"] not in P_MODES[entry["dtype"]]:
        return f"p_mode {entry['p_mode']!r} does not fit dtype {entry['dtype']!r} (it takes {P_MODES[entry['dtype']]})"
    if entry["dtype"] == "bf16" and (entry["p_shift"] != 0 or entry["scale_block"] is not None):
        return "p_shift must be 0 and scale_block null for dtype 'bf16'"
    if entry["scale_block"] is not None and entry["tile_n"] % entry["scale_block"]:
        return f"scale_block {entry['scale_block']} must divide tile_n {entry['tile_n']}"
    low, high = entry["seqlen_min"], entry["seqlen_max"]
    if low is not None and high is not None and low >= high:
        return f"seqlen_min {low} must be below seqlen_max {high} (the range is [seqlen_min, seqlen_max))"
    return _common(entry)


def _common(entry: dict) -> str | None:
    """The rules every kind shares: static shared memory within shared_bytes, no field named like an attribute."""
    static = entry["resources"].get(STATIC_SHARED_RESOURCE, 0)
    if type(static) is not int or not 0 <= static <= entry["shared_bytes"]:
        return (f"resources.{STATIC_SHARED_RESOURCE} = {static!r} must be an integer between 0 and shared_bytes "
                f"({entry['shared_bytes']})")
    clashes = sorted(set(entry) & DERIVED_ATTRIBUTES)
    if clashes:
        return f"fields {clashes} are reserved for the loader"
    return None


def _validate_kind(entry: dict) -> str | None:
    rules = KIND_FIELD_RULES.get(entry["kind"])
    if rules is None:
        return f"kind must be one of {list(KIND_FIELD_RULES)} (or absent: an attention kernel), got {entry['kind']!r}"
    missing = [field for field in rules if field not in entry]
    if missing:
        return f"missing fields {missing} (kind {entry['kind']!r})"
    for field, rule in rules.items():
        problem = rule(entry[field])
        if problem:
            return f"{field} {problem}, got {entry[field]!r}"
    if entry["tile_keys"] % entry["key_group"]:
        return f"key_group {entry['key_group']} must divide tile_keys {entry['tile_keys']}"
    return _common(entry)


class Kernel:
    """One code object of the manifest. Fields are attributes (`kernel.tile_m`); `image()` reads the object."""

    def __init__(self, entry: dict, root: Path):
        label = entry.get("name", "<unnamed>") if isinstance(entry, dict) else "<unnamed>"
        problem = validate_entry(entry)
        if problem:
            raise ManifestError(f"kernel {label}: {problem}")
        try:
            layout = ArgLayout.from_manifest(entry["args"], f"kernel {label}",
                                             entry["resources"].get(KERNARG_SIZE_RESOURCE))
        except ValueError as error:
            raise ManifestError(str(error)) from None
        self.__dict__.update(entry)  # plain attributes: launches read several per call
        self.kind = entry.get("kind", ATTENTION)
        self._entry = dict(entry)
        self._root = root
        self.layout = layout
        self.dynamic_shared_bytes = entry["shared_bytes"] - entry["resources"].get(STATIC_SHARED_RESOURCE, 0)

    def __getattr__(self, field: str):  # reached only for names that are not fields
        raise AttributeError(f"kernel {self.__dict__.get('name')} has no field {field!r}")

    @property
    def fields(self) -> dict:
        """A copy of the manifest entry."""
        return dict(self._entry)

    def serves(self, seqlen: int) -> bool:
        """Whether seqlen lies in the entry's [seqlen_min, seqlen_max) (null: unbounded)."""
        return ((self.seqlen_min is None or seqlen >= self.seqlen_min)
                and (self.seqlen_max is None or seqlen < self.seqlen_max))

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
        if self.kind != ATTENTION:
            return (f"{self.target}/{self.name}: kind={self.kind} dtype={self.dtype} d_v={self.d_v} "
                    f"tile_keys={self.tile_keys} key_group={self.key_group}")
        seqlens = f"[{self.seqlen_min or 1}, {self.seqlen_max or 'inf'})"
        return (f"{self.target}/{self.name}: dtype={self.dtype} d_qk={self.d_qk} d_v={self.d_v} "
                f"p_mode={self.p_mode}{' (default)' if self.p_mode_default else ''} schedule={self.schedule} "
                f"seqlen {seqlens} tile_m={self.tile_m} tile_n={self.tile_n}")

    def __repr__(self) -> str:
        return f"Kernel({self.variant()})"


class Manifest:
    """Every kernel of one manifest file; code object paths are relative to the file's folder.

    `kernels` holds the attention kernels, `objects` every valid entry of every kind; `invalid` maps each malformed
    entry (by name) to its error (left out of both)."""

    def __init__(self, data: dict, root: Path, source: str = "manifest"):
        from . import __version__

        if not isinstance(data, dict) or not isinstance(data.get("kernels"), list):
            raise ManifestError(f"{source}: expected an object with a 'kernels' list")
        if data.get("version") != __version__:
            raise ManifestError(f"{source}: version {data.get('version')!r} does not match zyfa-kernels "
                                f"{__version__}; rebuild the objects with `python -m asmgen.build`")
        self.version = data["version"]
        self.source = source
        self.objects: list[Kernel] = []
        self.invalid: dict[str, str] = {}
        seen = set()
        for index, entry in enumerate(data["kernels"]):
            name = entry.get("name") if isinstance(entry, dict) else None
            key = (entry.get("target"), name) if isinstance(entry, dict) else (None, None)
            if name is not None and key in seen:
                raise ManifestError(f"{source}: kernel {key[0]}/{name} appears twice")
            seen.add(key)
            try:
                self.objects.append(Kernel(entry, root))
            except ManifestError as error:
                self.invalid[str(name) if isinstance(name, str) else f"#{index}"] = str(error)
        self.kernels: list[Kernel] = [k for k in self.objects if k.kind == ATTENTION]

    def check(self) -> Manifest:
        """This manifest, or ManifestError listing every invalid entry (the build and the tests require none)."""
        if self.invalid:
            raise ManifestError(f"{self.source}: " + "; ".join(self.invalid.values()))
        return self

    @classmethod
    def from_file(cls, path: str | Path) -> Manifest:
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as error:
            raise ManifestError(f"cannot read the manifest {path}: {error}") from None
        return cls(data, path.resolve().parent, str(path))

    def of(self, target: str) -> list[Kernel]:
        return [k for k in self.kernels if k.target == target]

    def not_found(self, target: str, wanted: str, problem: str = "no kernel matches") -> KernelNotFound:
        """The KernelNotFound of a failed lookup: the target's kernels and any entries left out as invalid."""
        listing = "\n  ".join(k.variant() for k in self.of(target)) or "(none)"
        text = f"{problem} target={target!r} {wanted}; the {target} kernels are:\n  {listing}"
        if self.invalid:
            text += ("\nentries of the manifest left out as invalid (rebuild with `python -m asmgen.build`):\n  "
                     + "\n  ".join(self.invalid.values()))
        return KernelNotFound(text)

    def find(self, target: str, **fields) -> Kernel:
        """The one kernel of `target` whose fields equal `fields` (an attention kernel unless `kind` is given);
        KernelNotFound (a KeyError) lists the variants."""
        kind = fields.pop("kind", ATTENTION)
        pool = [k for k in self.objects if k.target == target and k.kind == kind]
        matches = [k for k in pool if all(k._entry.get(f, _ABSENT) == v for f, v in fields.items())]
        if len(matches) == 1:
            return matches[0]
        wanted = ", ".join(f"{f}={v!r}" for f, v in fields.items())
        raise self.not_found(target, wanted, "no kernel matches" if not matches else f"{len(matches)} kernels match")


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
