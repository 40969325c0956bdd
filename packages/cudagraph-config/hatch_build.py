"""Put ``refactor/renames.toml`` into a wheel built straight from a source checkout.

A wheel built from the sdist (as ``python -m build`` and package indexes do) finds the table in the sdist's
``src/cudagraph/config/data/`` and needs nothing from here. An editable install adds nothing: it reads the checkout's
``refactor/renames.toml`` itself, so no stale copy lands in site-packages.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

PACKAGED = "cudagraph/config/data/renames.toml"


class RenamesTableHook(BuildHookInterface):
    """Force-include the checkout's rename table when the tree being built has no packaged copy."""

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        """Add the checkout's table at the wheel path ``cudagraph.config.renames`` reads first."""
        root = Path(self.root)
        if version == "editable" or (root / "src" / PACKAGED).is_file():
            return
        build_data["force_include"][str(root.parents[1] / "refactor" / "renames.toml")] = PACKAGED
