"""What the packaging tests know about the workspace: each distribution, its version, its declared dependencies."""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: cudagraph-config requires tomli there, and `nox -s packaging` installs it
    import tomli as tomllib

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
    extras: dict[str, tuple[Requirement, ...]]
    pyproject: dict

    @property
    def module(self) -> str:
        """The one ``cudagraph.<module>`` package this distribution ships."""
        (package,) = [p.name for p in (self.directory / "src" / "cudagraph").iterdir() if p.is_dir()]
        return package

    @property
    def source(self) -> Path:
        """The directory of ``cudagraph.<module>``."""
        return self.directory / "src" / "cudagraph" / self.module


def dunder_versions(path: Path) -> list[str]:
    """Every literal ``__version__ = "..."`` assigned at the top level of ``path``."""
    return [
        node.value.value
        for node in ast.parse(path.read_text()).body
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets)
        and isinstance(node.value, ast.Constant)
    ]


def _version(directory: Path, pyproject: dict) -> str:
    """The version hatch builds: the static one, else the ``__version__`` at ``[tool.hatch.version] path``."""
    if "version" in pyproject["project"]:
        return pyproject["project"]["version"]
    (version,) = dunder_versions(directory / pyproject["tool"]["hatch"]["version"]["path"])
    return version


def load_distributions() -> dict[str, Distribution]:
    """Every workspace distribution, keyed by distribution name."""
    result = {}
    for relative in DISTRIBUTION_DIRS:
        directory = ROOT / relative
        pyproject = tomllib.loads((directory / "pyproject.toml").read_text())
        project = pyproject["project"]
        requirements = tuple(Requirement(text) for text in project.get("dependencies", []))
        extras = {
            extra: tuple(Requirement(text) for text in texts)
            for extra, texts in project.get("optional-dependencies", {}).items()
        }
        name = project["name"]
        result[name] = Distribution(directory, name, _version(directory, pyproject), requirements, extras, pyproject)
    return result
