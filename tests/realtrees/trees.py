"""Real trees the codemods are proven on: released SGLang sources, downloaded once and cached.

``python tests/realtrees/trees.py fetch`` (what ``nox -s tests`` runs first) downloads each wheel with
``pip download --no-deps`` and unpacks its ``sglang/`` package into the cache; offline it says so and the tests that
need a tree skip with that reason. The cache is ``$CUDAGRAPH_REAL_TREES`` or ``~/.cache/cudagraph/real-trees``.
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


TREES = (
    RealTree("sglang", "0.5.9", "sglang"),
    RealTree("sglang", "0.5.13", "sglang"),
    RealTree("sglang", "0.5.23", "sglang", already_migrated=True),
    RealTree("pymllm", "latest", "pymllm"),
)
"""SGLang across the legacy era and after it; pymllm where the index has it (it has not so far)."""


def cache_dir() -> Path:
    """The cache root."""
    configured = os.environ.get("CUDAGRAPH_REAL_TREES")
    return Path(configured) if configured else Path.home() / ".cache" / "cudagraph" / "real-trees"


def fetch(tree: RealTree) -> str:
    """Download and unpack ``tree`` unless cached; returns one line saying what happened."""
    if tree.ready():
        return f"{tree.name}: cached at {tree.path()}"
    requirement = tree.distribution if tree.version == "latest" else f"{tree.distribution}=={tree.version}"
    with tempfile.TemporaryDirectory() as download:
        command = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", download, requirement]
        result = subprocess.run(command, capture_output=True, text=True, timeout=900)
        wheels = list(Path(download).glob("*.whl"))
        if result.returncode != 0 or not wheels:
            reason = (result.stderr.strip().splitlines() or ["no wheel"])[-1]
            return f"{tree.name}: not available ({reason})"
        target = tree.path()
        target.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheels[0]) as archive:
            members = [member for member in archive.namelist() if member.startswith(f"{tree.package}/")]
            archive.extractall(target, members)
    return f"{tree.name}: unpacked into {target}"


def main(argv: list[str]) -> int:
    """``fetch``: download every tree not cached yet; never fails the caller (offline is a skip, not an error)."""
    if argv != ["fetch"]:
        print("usage: python tests/realtrees/trees.py fetch", file=sys.stderr)
        return 2
    for tree in TREES:
        try:
            print(fetch(tree))
        except (OSError, subprocess.SubprocessError, zipfile.BadZipFile) as error:
            print(f"{tree.name}: not available ({error})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
