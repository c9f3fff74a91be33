"""The installed version (written once, in the repository's VERSION file, and read by each package's build)."""

from importlib import metadata

__version__ = metadata.version("zyfa-torch")
