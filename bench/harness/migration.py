"""Migration section (CPU): ``cudagraph-migrate`` over a real tree, timed with ``-j 1`` and ``-j N``.

The tree is the cached SGLang 0.5.13 source the codemod tests use (``$CUDAGRAPH_REAL_TREES`` or
``~/.cache/cudagraph/real-trees``) when present, else a generated legacy-style tree; every run migrates a fresh
copy and a second ``--check`` run must find nothing left to change. The timing itself is
``codemods/bench_migrate.py``'s, reused here.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from .rows import BenchResult, MigrationRow

ROOT = Path(__file__).resolve().parents[2]
REAL_TREE = "sglang-0.5.13"


@dataclass(frozen=True)
class MigrationSettings:
    """Which tree and which ``-j`` values."""

    jobs: tuple[int, ...]
    generated_files: int
    use_real_tree: bool = True


def _bench_migrate() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_migrate", ROOT / "codemods" / "bench_migrate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def real_tree_path() -> Path | None:
    """The cached SGLang tree, or None when it is not there."""
    configured = os.environ.get("CUDAGRAPH_REAL_TREES")
    cache = Path(configured) if configured else Path.home() / ".cache" / "cudagraph" / "real-trees"
    tree = cache / REAL_TREE
    return tree if tree.is_dir() and any(tree.rglob("*.py")) else None


def usable_cores() -> int:
    """Cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def run_migration(result: BenchResult, settings: MigrationSettings) -> None:
    """Time the migration at every ``-j`` in ``settings`` and add one row per run."""
    bench_migrate = _bench_migrate()
    with tempfile.TemporaryDirectory(prefix="cudagraph-bench-migrate-") as scratch_name:
        scratch = Path(scratch_name)
        source = real_tree_path() if settings.use_real_tree else None
        if source is not None:
            name = REAL_TREE
        else:
            source = scratch / "generated"
            bench_migrate.generate_tree(source, settings.generated_files)
            name = f"generated-{settings.generated_files}"
        for jobs in settings.jobs:
            run = bench_migrate.time_run(source, jobs, scratch)
            result.migration.append(
                MigrationRow(
                    tree=name,
                    files=int(run["files"]),
                    jobs=jobs,
                    seconds=float(run["seconds"]),
                    exit_status=int(run["exit_status"]),
                    recheck_exit_status=int(run["second_run_check_exit_status"]),
                )
            )
