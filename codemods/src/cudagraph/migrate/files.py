"""Finding the Python files to migrate (``.gitignore`` and ``--exclude`` honoured) and writing results atomically.

Discovery prunes hidden directories (``.git``, ``.venv``, ``.nox``...), ``__pycache__`` and ``node_modules`` while
walking, and every directory's ``.gitignore`` applies below it (``pathspec`` implements git's matching). A write goes
to a temporary file in the same directory and is renamed over the original, so an interrupted run leaves every file
either as it was or fully migrated, never half-written.
"""

from __future__ import annotations

import os
import stat
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pathspec

__all__ = ["Discovery", "atomic_write", "discover", "write_or_check"]

_SKIPPED_DIRECTORIES = frozenset({"__pycache__", "node_modules"})
"""Never descended into, besides hidden directories."""


@dataclass
class Discovery:
    """The files found under the given paths, and the paths that do not exist."""

    files: list[Path] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)


def _is_python_name(filename: str) -> bool:
    return filename.endswith(".py")


def discover(
    paths: Iterable[str | Path],
    exclude: Sequence[str] = (),
    *,
    use_gitignore: bool = True,
    wanted: Callable[[str], bool] = _is_python_name,
) -> Discovery:
    """Every ``*.py`` file under ``paths`` (every file whose name ``wanted`` accepts; files given directly are taken
    as they are), sorted, minus exclusions.

    ``exclude`` holds gitignore-style patterns matched against paths relative to the argument they were found under
    (``vendor`` anywhere, ``pkg/*.py``, ``*_pb2.py``); a file named directly is excluded when its name matches.
    """
    excluded = pathspec.GitIgnoreSpec.from_lines(exclude)
    found: dict[Path, None] = {}
    missing: list[str] = []
    for raw in paths:
        root = Path(raw)
        if root.is_file():
            if not excluded.match_file(root.name):
                found[root] = None
        elif root.is_dir():
            for path in sorted(_walk(root, excluded, use_gitignore, wanted)):
                found[path] = None
        else:
            missing.append(str(raw))
    return Discovery(files=list(found), missing=missing)


def _walk(
    root: Path, excluded: pathspec.PathSpec, use_gitignore: bool, wanted: Callable[[str], bool]
) -> Iterable[Path]:
    ignores: list[tuple[Path, pathspec.PathSpec]] = []
    for directory, subdirectories, filenames in os.walk(root):
        here = Path(directory)
        ignores = [(base, spec) for base, spec in ignores if here == base or base in here.parents]
        if use_gitignore and ".gitignore" in filenames:
            lines = (here / ".gitignore").read_text(encoding="utf-8", errors="replace").splitlines()
            ignores.append((here, pathspec.GitIgnoreSpec.from_lines(lines)))

        subdirectories[:] = sorted(
            name
            for name in subdirectories
            if not name.startswith(".")
            and name not in _SKIPPED_DIRECTORIES
            and not _skipped(here / name, True, root, excluded, ignores)
        )
        for filename in filenames:
            path = here / filename
            if wanted(filename) and not _skipped(path, False, root, excluded, ignores):
                yield path


def _skipped(
    path: Path, is_dir: bool, root: Path, excluded: pathspec.PathSpec, ignores: list[tuple[Path, pathspec.PathSpec]]
) -> bool:
    """Whether ``--exclude`` (relative to ``root``) or a ``.gitignore`` above ``path`` drops it."""
    suffix = "/" if is_dir else ""
    if excluded.match_file(path.relative_to(root).as_posix() + suffix):
        return True
    return any(spec.match_file(path.relative_to(base).as_posix() + suffix) for base, spec in ignores)


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


def write_or_check(path: Path, text: str, *, write: bool, stale_hint: str) -> int:
    """Write ``text`` to the generated data file ``path`` (``write``), or check it is current: 0, or 1 with
    ``stale_hint`` (what to run) on stderr."""
    if write:
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path}")
        return 0
    if path.read_text(encoding="utf-8") != text:
        print(f"{path} is stale: {stale_hint}", file=sys.stderr)
        return 1
    return 0
