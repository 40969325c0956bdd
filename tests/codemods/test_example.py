"""The whole project: the bundled legacy example exercises the table, migrates cleanly, and its tests pass after."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from cudagraph.migrate.cli import EXIT_OK, main
from cudagraph.migrate.example import example_source
from cudagraph.migrate.renames import RenameKind, load_renames

EXAMPLE = example_source()


def _example_text() -> str:
    return "\n".join(path.read_text() for path in sorted(EXAMPLE.rglob("*.py")))


def test_the_example_exercises_every_row_of_the_legacy_shim_modules_and_every_non_module_kind() -> None:
    text = _example_text()
    missing = []
    for row in load_renames():
        if row.kind is RenameKind.MODULE:
            if row.old.startswith("cudagraph.legacy.") and row.old.rpartition(".")[2] not in text:
                missing.append(row.old)
        elif row.kind is RenameKind.SYMBOL:
            if row.old_module.startswith("cudagraph.legacy.") and not re.search(rf"\b{row.old_name}\b", text):
                missing.append(row.old)
        elif not re.search(rf"(?<![\w\-]){re.escape(row.old)}(?![\w\-])", text):
            missing.append(row.old)
    assert missing == []


def test_the_example_migrates_and_its_tests_pass(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "cudagraph.migrate.example", "--workdir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "failed: 0" in result.stdout
    assert re.search(r"\d+ passed", result.stdout)
    migrated = tmp_path / "legacy_engine"
    # Nothing legacy is left: a second migration finds nothing, and no legacy module is imported.
    assert main([str(migrated), "--check", "--no-progress"]) == EXIT_OK
    migrated_text = "\n".join(path.read_text() for path in migrated.rglob("*.py"))
    assert "cudagraph.legacy" not in migrated_text
    # The engine's own forward context stayed its own.
    assert "from .forward_context import ForwardContext, get_forward_context" in migrated_text
