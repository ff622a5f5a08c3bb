"""The installed veritap version, from the package metadata (what `--version` prints)."""

from __future__ import annotations

import importlib.metadata

DISTRIBUTION = "veritap"


def package_version() -> str:
    """The version of the installed veritap distribution (pyproject.toml's `version`)."""
    return importlib.metadata.version(DISTRIBUTION)
