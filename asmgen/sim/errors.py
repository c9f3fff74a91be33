"""Errors the simulator raises: each names the instruction (address and text) and the rule it broke."""


class SimError(RuntimeError):
    """A program or launch the simulator cannot run as written (unsupported form, bad argument, runaway loop)."""


class HazardError(SimError):
    """A VALU, store or MFMA read an MFMA result fewer wait states after it was issued than gfx950 requires."""


class MemoryFault(SimError):
    """An access outside the allocated global memory or outside the workgroup's LDS allocation."""


class DeadlockError(SimError):
    """Waves of a workgroup wait at s_barrier while others have ended or wait elsewhere forever."""
