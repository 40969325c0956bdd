"""Put ``refactor/migration-guide.md`` into a wheel built straight from a source checkout.

A wheel built from the sdist (as ``python -m build`` and package indexes do) finds the guide in the sdist's
``src/cudagraph/migrate/data/`` and needs nothing from here. An editable install adds nothing: it reads the checkout's
``refactor/migration-guide.md`` itself, so no stale copy lands in site-packages.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

PACKAGED = "cudagraph/migrate/data/migration-guide.md"


class MigrationGuideHook(BuildHookInterface):
    """Force-include the checkout's migration guide when the tree being built has no packaged copy."""

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        """Add the checkout's guide at the wheel path ``cudagraph.migrate.guide`` reads first."""
        root = Path(self.root)
        if version == "editable" or (root / "src" / PACKAGED).is_file():
            return
        build_data["force_include"][str(root.parent / "refactor" / "migration-guide.md")] = PACKAGED
