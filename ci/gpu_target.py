"""Which kernel target the GPU of this machine runs, for ci/gpu.sh: prints `sm90a` or `gfx950` on stdout.

    python -m ci.gpu_target            prints the target of the current GPU (exit 1 and a reason on stderr when the
                                       machine has no GPU that ZYFA's kernels run on)
    python -m ci.gpu_target --describe prints the target and what it was chosen from

The rule (`target_for`) is pure so that it can be tested without a GPU: a ROCm build of torch on a GPU whose
gcnArchName starts with gfx950 (e.g. "gfx950:sramecc+:xnack-") is an MI355X; a CUDA build on a GPU of compute
capability 9.0 is an H100/H200.
"""

from __future__ import annotations

import sys

TARGETS = ("sm90a", "gfx950")


class UnsupportedGpu(RuntimeError):
    """This machine's GPU (or its absence) has no ZYFA kernel target."""


def target_for(hip_version: str | None, arch_name: str | None, capability: tuple[int, int] | None) -> str:
    """The kernel target for one GPU.

    hip_version: torch.version.hip (None on CUDA builds); arch_name: the device's gcnArchName (ROCm only);
    capability: the device's (major, minor) compute capability (CUDA only)."""
    if hip_version:
        arch = (arch_name or "").split(":")[0].strip()
        if arch == "gfx950":
            return "gfx950"
        raise UnsupportedGpu(f"ROCm GPU {arch or '(unknown architecture)'}: ZYFA's AMD kernels need gfx950 (MI355X)")
    if capability is None:
        raise UnsupportedGpu("no GPU: neither a CUDA nor a ROCm device is visible to torch")
    if tuple(capability) == (9, 0):
        return "sm90a"
    raise UnsupportedGpu(f"CUDA GPU of compute capability {capability[0]}.{capability[1]}: ZYFA's NVIDIA kernels "
                         f"need 9.0 (H100/H200)")


def detect() -> tuple[str, str]:
    """(target, description) of the current GPU; raises UnsupportedGpu."""
    import torch

    hip = getattr(torch.version, "hip", None)
    if not torch.cuda.is_available():
        raise UnsupportedGpu(f"torch {torch.__version__} sees no GPU (torch.version.hip={hip})")
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    arch = getattr(props, "gcnArchName", None) if hip else None
    capability = None if hip else (props.major, props.minor)
    target = target_for(hip, arch, capability)
    platform = f"ROCm {hip}, {arch}" if hip else f"CUDA {torch.version.cuda}, capability {props.major}.{props.minor}"
    return target, f"{props.name} ({platform}, torch {torch.__version__})"


def main(argv: list[str]) -> int:
    try:
        target, description = detect()
    except UnsupportedGpu as error:
        print(f"gpu_target: {error}; set GPU_TARGET to one of {', '.join(TARGETS)} to choose the stages by hand",
              file=sys.stderr)
        return 1
    print(f"{target} {description}" if "--describe" in argv else target)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
