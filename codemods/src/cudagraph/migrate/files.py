"""Finding the Python files to migrate (``.gitignore`` and ``--exclude`` honoured) and writing results atomically.

Discovery prunes hidden directories (``.git``, ``.venv``, ``.nox``...), ``__pycache__`` and ``node_modules`` while
walking, and every directory's ``.gitignore`` applies below it (``pathspec`` implements git's matching). Only
``.py``/``.pyi`` files are read as Python: a file of another kind named on the command line is skipped and named.
Symbolic links are never replaced by files: a link to a file inside the tree is migrated through its target (once,
however many links lead there), a link that leaves the tree, or leads nowhere, is left as it is and named; a linked
directory is not followed. A write goes to a temporary file in the same directory and is renamed over the original,
so an interrupted run leaves every file either as it was or fully migrated, never half-written.
"""

from __future__ import annotations

import functools
import os
import stat
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pathspec

__all__ = ["PYTHON_SUFFIXES", "Discovery", "Skipped", "atomic_write", "discover", "patch_base", "write_or_check"]

PYTHON_SUFFIXES = (".py", ".pyi")
"""The only files read (and rewritten) as Python source."""

_SKIPPED_DIRECTORIES = frozenset({"__pycache__", "node_modules"})
"""Never descended into, besides hidden directories."""


@dataclass(frozen=True)
class Skipped:
    """A path discovery left alone, and why (one phrase the summary prints after the path)."""

    path: str
    reason: str


@dataclass
class Discovery:
    """The files found under the given paths, the paths skipped (with why), and the paths that do not exist."""

    files: list[Path] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)


def _is_python_name(filename: str) -> bool:
    return filename.endswith(PYTHON_SUFFIXES)


def discover(
    paths: Iterable[str | Path],
    exclude: Sequence[str] = (),
    *,
    use_gitignore: bool = True,
    wanted: Callable[[str], bool] = _is_python_name,
) -> Discovery:
    """Every ``.py``/``.pyi`` file under ``paths`` (every file whose name ``wanted`` accepts), sorted, minus
    exclusions.

    ``exclude`` holds gitignore-style patterns matched against paths relative to the argument they were found under
    (``vendor`` anywhere, ``pkg/*.py``, ``*_pb2.py``); a file named directly is excluded when its name matches. A file
    named directly that is not Python is skipped. A symbolic link to a file stands for its target when the target is
    inside the argument it was found under (a file named directly: inside its folder) and is then migrated once,
    under the link's name unless the target itself is found too; any other link is skipped, and links to folders
    inside a tree are not followed (a folder named directly is walked, link or not).
    """
    excluded = pathspec.GitIgnoreSpec.from_lines(exclude)
    found: dict[Path, None] = {}
    missing: list[str] = []
    skipped: list[Skipped] = []
    for raw in paths:
        root = Path(raw)
        if root.is_dir():
            candidates = sorted(_walk(root, excluded, use_gitignore, wanted))
        elif root.is_file():
            if excluded.match_file(root.name):
                continue
            if not wanted(root.name):
                skipped.append(Skipped(str(root), "not a Python file (.py, .pyi)"))
                continue
            candidates = [root]
        else:
            missing.append(str(raw))
            continue
        tree = root if root.is_dir() else root.parent
        for path in candidates:
            reason = _link_problem(path, tree) if path.is_symlink() else None
            if reason:
                skipped.append(Skipped(str(path), reason))
            else:
                found[path] = None
    # One entry per file on disk: a file reached through links as well keeps its own name (or the first link's).
    chosen: dict[Path, Path] = {}
    for path in found:
        target = path.resolve()
        if target not in chosen or (chosen[target].is_symlink() and not path.is_symlink()):
            chosen[target] = path
    files = [path for path in found if chosen[path.resolve()] == path]
    return Discovery(files=files, missing=missing, skipped=skipped)


def _link_problem(link: Path, tree: Path) -> str | None:
    """Why the symbolic link ``link`` is not migrated, or None when its target is a file inside ``tree``."""
    target = Path(os.path.realpath(link))
    if not target.exists():
        return "a link to nothing: left as it is"
    if not target.is_file():
        return "a link to a folder: not followed"
    if not target.is_relative_to(Path(os.path.realpath(tree))):
        return f"a link to {target}, outside the tree: left as it is"
    return None


@functools.lru_cache(maxsize=4096)
def _repository_root(folder: Path) -> Path | None:
    """The top of the git work tree holding the absolute ``folder`` (the nearest folder up with a ``.git``), or None."""
    for candidate in (folder, *folder.parents):
        if (candidate / ".git").exists():
            return candidate
    return None


def patch_base(path: Path, given: Sequence[str]) -> str:
    """The folder a patch names ``path`` relative to: the top of its git work tree, so that ``git apply`` (or
    ``git -C TREE apply``) takes the patch from that repository; outside a repository, the argument of ``given`` it was
    found under (a folder, or a file's own folder), so that it applies from there."""
    absolute = Path(os.path.abspath(path))
    repository = _repository_root(absolute.parent)
    if repository is not None:
        return str(repository)
    folders = [Path(os.path.abspath(argument)) for argument in given]
    under = [folder for folder in folders if folder == absolute or folder in absolute.parents]
    if not under:
        return str(absolute.parent)
    deepest = max(under, key=lambda folder: len(folder.parts))
    return str(deepest.parent if deepest == absolute else deepest)


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
    """Replace ``path``'s content with ``data`` in one rename, keeping its permission bits; a symbolic link stays a
    link (its target is written)."""
    path = Path(os.path.realpath(path))
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
