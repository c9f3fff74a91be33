"""The loader's exceptions (the extension raises these too)."""

from __future__ import annotations


class DriverError(RuntimeError):
    """A driver call failed: `call` is the entry point, `code` its numeric result, `name` the driver's name for it."""

    def __init__(self, call: str, code: int, name: str):
        super().__init__(f"{call} failed with {name} ({code})")
        self.call = call
        self.code = code
        self.name = name

    def __reduce__(self):
        return type(self), (self.call, self.code, self.name)


class DriverUnavailable(RuntimeError):
    """The CUDA or HIP driver library cannot be opened here (a machine without that GPU driver)."""


class ManifestError(ValueError):
    """The manifest or a code object in the package is malformed or does not match its recorded hash."""


class KernelNotFound(KeyError):
    """No kernel (or more than one) of the manifest matches a lookup; the message lists the variants."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""
