"""Check the installed wheels from outside the source tree (`nox -s wheels` runs it in a fresh virtualenv).

    python installed_wheels.py [--with-torch]

zyfa_kernels must import from site-packages, carry its MIT licence in its metadata, hold every code object of its
manifest with the recorded sha256, and load its native loader extension (which opens no driver until a launch).
With --with-torch, zyfa and zyfa_tools too: their licences, and one causal call on the CPU reference path (BF16 and
FP8) whose error against float64 must be that of the numerics (BF16 about 2e-3, FP8 about 1e-2 on these inputs).
Exits 1 naming what failed.
"""

from __future__ import annotations

import argparse
import sys
from importlib import metadata
from pathlib import Path

ERROR_BOUNDS = {"bf16": 4e-3, "fp8": 3e-2}  # Gaussian inputs, S = 256: measured 1.8e-3 and 0.9-1.4e-2


def installed(module) -> Path:
    path = Path(module.__file__).resolve()
    if "site-packages" not in path.parts:
        raise SystemExit(f"{module.__name__} imports from {path}, not from an installed wheel")
    return path


def licence(distribution: str) -> None:
    files = [f for f in metadata.distribution(distribution).files or () if "licenses" in f.parts]
    if not files or "MIT License" not in files[0].read_text():
        raise SystemExit(f"{distribution}: no MIT licence file in its installed metadata ({files})")
    print(f"{distribution}: licence {files[0]}")


def check_kernels() -> None:
    import zyfa_kernels
    from zyfa_kernels import _loader

    print(f"zyfa_kernels {zyfa_kernels.__version__} from {installed(zyfa_kernels).parent}")
    licence("zyfa-kernels")
    kernels = zyfa_kernels.manifest().kernels
    sizes = [len(kernel.image()) for kernel in kernels]  # image() checks each object's sha256
    print(f"{len(kernels)} code objects, {sum(sizes)} bytes, sha256 as the manifest records")
    print(f"loader extension {Path(_loader.__file__).name}")


def check_torch() -> None:
    import torch

    import zyfa
    import zyfa_tools
    from zyfa_tools import inputs
    from zyfa_tools.reference import attention_fp64, relative_rms_error

    installed(zyfa), installed(zyfa_tools)
    licence("zyfa-torch")
    licence("zyfa-tools")
    q, k, v = inputs.gaussian(1, 256, 4, 1, 128, 128)
    for name, dtype in (("bf16", torch.bfloat16), ("fp8", torch.float8_e4m3fn)):
        q_, k_, v_, descales = inputs.quantize(q, k, v, dtype)
        out = zyfa.flash_attn_func(q_, k_, v_, causal=True, **descales)
        error = relative_rms_error(out, attention_fp64(q_, k_, v_, **descales))
        print(f"zyfa {zyfa.__version__} {name} on the CPU: relative RMS error vs float64 {error:.2e}")
        if not error <= ERROR_BOUNDS[name]:
            raise SystemExit(f"{name}: error {error:.2e} above {ERROR_BOUNDS[name]:.0e}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--with-torch", action="store_true", help="also check zyfa and zyfa_tools with a CPU call")
    args = ap.parse_args(argv)
    check_kernels()
    if args.with_torch:
        check_torch()
    print("installed wheels: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
