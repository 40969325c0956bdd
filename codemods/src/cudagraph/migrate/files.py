"""Finding the Python files to migrate and writing results atomically.

A write goes to a temporary file in the same directory and is renamed over the original, so an interrupted run
leaves every file either as it was or fully migrated, never half-written.
"""

from __future__ import annotations

import fnmatch
import os
import stat
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Discovery", "atomic_write", "discover"]

_SKIPPED_DIRECTORIES = frozenset({"__pycache__", "node_modules"})
"""Never descended into, besides hidden directories (``.git``, ``.venv``, ``.nox``...)."""


@dataclass
class Discovery:
    """The files found under the given paths, and the paths that do not exist."""

    files: list[Path] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)


def discover(paths: Iterable[str | Path], exclude: Sequence[str] = ()) -> Discovery:
    """Every ``*.py`` file under ``paths`` (files given directly are taken as they are), sorted, minus ``exclude``.

    An ``exclude`` glob matches a path relative to the argument it was found under, or any one component of it
    (``--exclude 'tests'``, ``--exclude 'vendor/*'``, ``--exclude '*_pb2.py'``).
    """
    found: dict[Path, None] = {}
    missing: list[str] = []
    for raw in paths:
        root = Path(raw)
        if root.is_file():
            if not _excluded(Path(root.name), exclude):
                found[root] = None
        elif root.is_dir():
            for path in sorted(_walk(root)):
                if not _excluded(path.relative_to(root), exclude):
                    found[path] = None
        else:
            missing.append(str(raw))
    return Discovery(files=list(found), missing=missing)


def _walk(root: Path) -> Iterable[Path]:
    for directory, subdirectories, filenames in os.walk(root):
        subdirectories[:] = [
            name for name in subdirectories if not name.startswith(".") and name not in _SKIPPED_DIRECTORIES
        ]
        for filename in filenames:
            if filename.endswith(".py"):
                yield Path(directory, filename)


def _excluded(relative: Path, patterns: Sequence[str]) -> bool:
    text = relative.as_posix()
    return any(
        fnmatch.fnmatch(text, pattern) or any(fnmatch.fnmatch(part, pattern) for part in relative.parts)
        for pattern in patterns
    )


def atomic_write(path: Path, data: bytes) -> None:
    """Replace ``path``'s content with ``data`` in one rename, keeping its permission bits."""
    mode = stat.S_IMODE(path.stat().st_mode)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".migrate-tmp")
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
