"""Real trees the codemods are proven on: released SGLang sources, downloaded once and cached.

``python tests/realtrees/trees.py fetch`` (what ``nox -s realtrees`` runs first) downloads each wheel with
``pip download --no-deps`` and unpacks its ``sglang/`` package into the cache. A tree it cannot get is recorded with
the reason (offline, or the index has no such release) and the tests that need it skip saying so and what to do.
The cache is ``$CUDAGRAPH_REAL_TREES`` or ``~/.cache/cudagraph/real-trees``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RealTree:
    """One released source tree: the distribution, its version, the package directory it ships."""

    distribution: str
    version: str
    package: str
    already_migrated: bool = False
    """Upstream moved off the legacy names before this release: a migration must change nothing legacy-free."""
    optional: bool = False
    """Tested where the index has it; ``fetch --strict`` does not fail without it."""

    @property
    def name(self) -> str:
        """``sglang-0.5.13``."""
        return f"{self.distribution}-{self.version}"

    def path(self) -> Path:
        """Where the unpacked tree lives (the directory that holds ``package/``)."""
        return cache_dir() / self.name

    def ready(self) -> bool:
        """Whether the tree is unpacked in the cache."""
        return (self.path() / self.package / "__init__.py").is_file()

    def unavailable_reason(self) -> str:
        """Why the tree is not in the cache and what to do about it (for a test's skip)."""
        recorded = _unavailable_note(self)
        if recorded.is_file():
            return f"{self.name}: {recorded.read_text().strip()}"
        return f"{self.name} is not in {self.path().parent}: `nox -s realtrees` fetches the trees and runs these tests"


TREES = (
    RealTree("sglang", "0.5.9", "sglang"),
    RealTree("sglang", "0.5.13", "sglang"),
    RealTree("sglang", "0.5.23", "sglang", already_migrated=True),
    RealTree("pymllm", "latest", "pymllm", optional=True),
)
"""SGLang across the legacy era and after it; pymllm where the index has it (it has not so far)."""


def cache_dir() -> Path:
    """The cache root."""
    configured = os.environ.get("CUDAGRAPH_REAL_TREES")
    return Path(configured) if configured else Path.home() / ".cache" / "cudagraph" / "real-trees"


# What pip prints when it could not reach the index at all (as opposed to reaching it and finding no release).
_OFFLINE_SIGNS = (
    "NewConnectionError",
    "Failed to establish a new connection",
    "Temporary failure in name resolution",
    "Name or service not known",
    "Network is unreachable",
    "ConnectTimeoutError",
    "ProxyError",
)


def _unavailable_note(tree: RealTree) -> Path:
    return cache_dir() / f"{tree.name}.unavailable"


def _why_not(tree: RealTree, requirement: str, pip_stderr: str) -> str:
    """The reason ``pip download`` got no wheel, in words that say what to do."""
    if any(sign in pip_stderr for sign in _OFFLINE_SIGNS):
        return (
            f"not fetched: the package index could not be reached (`pip download {requirement}` is offline); "
            "run `nox -s realtrees` with network access"
        )
    if "No matching distribution" in pip_stderr or "from versions: none" in pip_stderr:
        return (
            f"not fetched: the package index has no {requirement} wheel (nothing to test until one is published; "
            "`nox -s realtrees` tries again)"
        )
    last = (pip_stderr.strip().splitlines() or ["no wheel"])[-1]
    return f"not fetched: `pip download --no-deps {requirement}` failed ({last}); fix that, then run `nox -s realtrees`"


def fetch(tree: RealTree) -> str:
    """Download and unpack ``tree`` unless cached; returns one line saying what happened.

    A tree it cannot get leaves ``<cache>/<name>.unavailable`` holding the reason, which the tests' skip repeats.
    """
    if tree.ready():
        return f"{tree.name}: cached at {tree.path()}"
    requirement = tree.distribution if tree.version == "latest" else f"{tree.distribution}=={tree.version}"
    note = _unavailable_note(tree)
    with tempfile.TemporaryDirectory() as download:
        command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", download, requirement]
        result = subprocess.run(command, capture_output=True, text=True, timeout=900)
        wheels = list(Path(download).glob("*.whl"))
        if result.returncode != 0 or not wheels:
            reason = _why_not(tree, requirement, result.stderr)
            note.parent.mkdir(parents=True, exist_ok=True)
            note.write_text(reason + "\n")
            return f"{tree.name}: {reason}"
        note.unlink(missing_ok=True)
        target = tree.path()
        target.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheels[0]) as archive:
            members = [member for member in archive.namelist() if member.startswith(f"{tree.package}/")]
            archive.extractall(target, members)
    return f"{tree.name}: unpacked into {target}"


def main(argv: list[str]) -> int:
    """``fetch``: download every tree not cached yet. Exit 0 whatever could be fetched (the tests then skip, saying
    why), except with ``--strict`` (``nox -s realtrees``): then exit 1 if a tree that is not optional is missing."""
    if argv not in (["fetch"], ["fetch", "--strict"]):
        print("usage: python tests/realtrees/trees.py fetch [--strict]", file=sys.stderr)
        return 2
    missing = []
    for tree in TREES:
        try:
            print(fetch(tree))
        except (OSError, subprocess.SubprocessError, zipfile.BadZipFile) as error:
            _unavailable_note(tree).parent.mkdir(parents=True, exist_ok=True)
            _unavailable_note(tree).write_text(f"not fetched ({error}); run `nox -s realtrees` again\n")
            print(f"{tree.name}: not available ({error})")
        if not tree.ready() and not tree.optional:
            missing.append(tree.name)
    if missing and "--strict" in argv:
        print(f"missing real trees: {', '.join(missing)}; their tests would only skip", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
