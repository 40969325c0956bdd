"""What the packaging tests know about the workspace: each distribution, its version, its declared dependencies."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import tomllib
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]


def _workspace_member_dirs() -> tuple[str, ...]:
    """The distributions' folders, from the root pyproject's workspace members (the one list of them)."""
    members = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["uv"]["workspace"]["members"]
    found = (path for pattern in members for path in sorted(ROOT.glob(pattern)) if (path / "pyproject.toml").is_file())
    return tuple(str(path.relative_to(ROOT)) for path in found)


DISTRIBUTION_DIRS = _workspace_member_dirs()


@dataclass(frozen=True)
class Distribution:
    """One workspace distribution as its pyproject.toml declares it."""

    directory: Path
    name: str
    version: str
    requirements: tuple[Requirement, ...]

    @property
    def module(self) -> str:
        """The one ``cudagraph.<module>`` package this distribution ships."""
        (package,) = [p.name for p in (self.directory / "src" / "cudagraph").iterdir() if p.is_dir()]
        return package

    @property
    def source(self) -> Path:
        """The directory of ``cudagraph.<module>``."""
        return self.directory / "src" / "cudagraph" / self.module


def load_distributions() -> dict[str, Distribution]:
    """Every workspace distribution, keyed by distribution name."""
    result = {}
    for directory in DISTRIBUTION_DIRS:
        project = tomllib.loads((ROOT / directory / "pyproject.toml").read_text())["project"]
        requirements = tuple(Requirement(text) for text in project.get("dependencies", []))
        result[project["name"]] = Distribution(ROOT / directory, project["name"], project["version"], requirements)
    return result
