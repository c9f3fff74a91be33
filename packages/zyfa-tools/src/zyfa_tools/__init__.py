"""ZYFA tools: inputs that behave like real activations, accuracy evaluation, the demo."""

from __future__ import annotations

from importlib import metadata

__version__ = "0.1.0"

TORCH_DISTRIBUTION = "zyfa-torch"  # import name zyfa: the three wheels share one version


def _require_matching_zyfa() -> None:
    """Refuse an installed zyfa-torch of another version, with the fix in the message."""
    try:
        installed = metadata.version(TORCH_DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return  # running from a source tree
    if installed != __version__:
        raise ImportError(
            f"zyfa-tools {__version__} needs zyfa-torch {__version__}, but zyfa-torch {installed} is installed: "
            f"install matching versions, e.g. pip install zyfa-torch=={__version__}"
        )


_require_matching_zyfa()
