"""Build every code object into packages/zyfa-kernels and write its manifest.

    python -m asmgen.build                 # rebuild all targets, rewrite objects and manifest
    python -m asmgen.build --target sm90a  # one target (the other targets' entries are kept)
    python -m asmgen.build --check         # build into a temporary folder; fail if anything differs

Each target is a module (asmgen.sm90a, asmgen.gfx950) with
    KERNELS: list[dict]    one manifest entry per kernel, without the fields the build fills in
                           (every field of docs/loader.md's manifest table but target, file, sha256 and
                           resources, which the build fills in; each entry is validated by zyfa_kernels' rules)
    build(kernel, path)    write the code object for `kernel` to `path`
    inspect(kernel, path)  read back what the object declares: {"symbols": [...], "resources": {...}}
and entries of other kinds (e.g. the sm90a V^T pre-pass) from the modules KIND_MODULES names, likewise.
The manifest is the one description of every object that the loader and the dispatch read.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.util
import json
import sys
import tempfile
from pathlib import Path

from zyfa_kernels.manifest import validate_entry  # the manifest's rules (plain Python: no extension is loaded)

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "packages" / "zyfa-kernels" / "src" / "zyfa_kernels"
MANIFEST = PACKAGE / "manifest.json"
TARGETS = ("sm90a", "gfx950")
VERSION = (ROOT / "VERSION").read_text().strip()  # the one place the version is written


def _target(name: str):
    return importlib.import_module(f"asmgen.{name}")


# Entries of a kind other than attention come from a module of their own in the target's package (when it has
# one), with its own KERNELS, build() and inspect(): the target module's KERNELS stay attention kernels only.
KIND_MODULES = {"transpose_v": "transpose"}


def target_kernels(name: str) -> list[tuple[object, dict]]:
    """(module that builds it, entry) for every object of the target: its attention kernels, then other kinds."""
    found = [(_target(name), kernel) for kernel in _target(name).KERNELS]
    for module in KIND_MODULES.values():
        if importlib.util.find_spec(f"asmgen.{name}.{module}") is not None:
            mod = importlib.import_module(f"asmgen.{name}.{module}")
            found += [(mod, kernel) for kernel in mod.KERNELS]
    return found


def build_target(name: str, package: Path) -> list[dict]:
    """Build one target's objects under package/objects/<target>/ and return their manifest entries."""
    entries = []
    for builder, kernel in target_kernels(name):
        path = package / "objects" / name / kernel["file"]
        path.parent.mkdir(parents=True, exist_ok=True)
        print(f"[{name}] {kernel['name']} -> {path.name}", file=sys.stderr)
        builder.build(kernel, path)
        info = builder.inspect(kernel, path)
        if kernel["symbol"] not in info["symbols"]:
            raise SystemExit(f"{path.name}: symbol {kernel['symbol']} not found in {info['symbols']}")
        entry = {
            **kernel,
            "target": name,
            "file": f"objects/{name}/{kernel['file']}",
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
            "resources": info["resources"],
        }
        problem = validate_entry(entry)
        if problem:
            raise SystemExit(f"[{name}] {kernel['name']}: {problem}")
        entries.append(entry)
    return entries


def load_manifest(path: Path = MANIFEST) -> dict:
    if path.exists():
        return json.loads(path.read_text())
    return {"version": VERSION, "kernels": []}


def write_manifest(manifest: dict, path: Path) -> None:
    manifest["kernels"].sort(key=lambda k: (k["target"], k["name"]))
    path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")


def build(targets: list[str], package: Path) -> dict:
    manifest = load_manifest()
    manifest["version"] = VERSION
    kept = [k for k in manifest["kernels"] if k["target"] not in targets]
    manifest["kernels"] = kept + [e for t in targets for e in build_target(t, package)]
    return manifest


def check(targets: list[str]) -> list[str]:
    """Rebuild into a temporary folder and list every difference from the committed objects and manifest."""
    problems = []
    committed = load_manifest()
    with tempfile.TemporaryDirectory() as tmp:
        fresh = build(targets, Path(tmp))
        by_name = {k["name"]: k for k in committed["kernels"]}
        for entry in fresh["kernels"]:
            if entry["target"] not in targets:
                continue
            old = by_name.get(entry["name"])
            if old is None:
                problems.append(f"{entry['name']}: missing from the committed manifest")
                continue
            if old != entry:
                keys = sorted(k for k in set(old) | set(entry) if old.get(k) != entry.get(k))
                problems.append(f"{entry['name']}: manifest differs in {keys}")
            obj = PACKAGE / entry["file"]
            if not obj.exists() or obj.read_bytes() != (Path(tmp) / entry["file"]).read_bytes():
                problems.append(f"{entry['name']}: {entry['file']} differs from a fresh build")
        names = {e["name"] for e in fresh["kernels"]}
        problems += [f"{k['name']}: in the manifest but not built"
                     for k in committed["kernels"] if k["target"] in targets and k["name"] not in names]
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", choices=TARGETS + ("all",), default="all")
    ap.add_argument("--check", action="store_true", help="compare a fresh build with the committed objects")
    args = ap.parse_args(argv)
    targets = list(TARGETS) if args.target == "all" else [args.target]
    targets = [t for t in targets if getattr(_target(t), "KERNELS", None)]
    if args.check:
        problems = check(targets)
        for p in problems:
            print("objects-check:", p, file=sys.stderr)
        print(f"objects-check: {len(problems)} problem(s) in targets {targets}")
        return 1 if problems else 0
    write_manifest(build(targets, PACKAGE), MANIFEST)
    print(f"wrote {MANIFEST.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
