"""The exports manifest the codemods trust matches the packages, and every name the table points at exists."""

from __future__ import annotations

import importlib

import pytest

from cudagraph.migrate.exports import MODULE_SOURCES, load_exports, main, scan_sources
from cudagraph.migrate.renames import RenameKind, load_renames
from cudagraph.migrate.verify import unresolved_references

MANIFEST = load_exports()


@pytest.mark.parametrize("module", sorted(MODULE_SOURCES))
def test_the_manifest_is_what_the_installed_module_exports(module: str) -> None:
    imported = importlib.import_module(module)
    assert MANIFEST.modules[module] == frozenset(imported.__all__)
    missing = [name for name in imported.__all__ if not hasattr(imported, name)]
    assert missing == [], f"{module}.__all__ names what it does not define"


def test_the_manifest_file_is_current_with_the_sources() -> None:
    assert scan_sources() == {module: sorted(names) for module, names in MANIFEST.modules.items()}
    assert main(["--check"]) == 0


def test_every_target_of_the_rename_table_exists() -> None:
    table = load_renames()
    missing = [
        row.new for row in table.of_kind(RenameKind.SYMBOL) if not MANIFEST.exports(row.new_module, row.new_name)
    ]
    missing += [row.new for row in table.of_kind(RenameKind.MODULE) if not MANIFEST.has_module(row.new)]
    missing += [
        owner
        for row in table
        for owner in row.owners
        if not MANIFEST.exports(owner.rpartition(".")[0], owner.rpartition(".")[2])
    ]
    assert missing == []


def test_the_post_condition_sees_every_import_form() -> None:
    before = "x = 1\n"
    after = (
        "from cudagraph.runner import DecodeCudaGraphRunner, Nope\n"
        "import cudagraph.nothing\n"
        "import cudagraph.backend_utils as bu\n"
        "from cudagraph import runner, missing_module\n"
        "bu.freeze_gc(); bu.not_there(); runner.Gone; cudagraph.config.Absent\n"
    )
    spelled = [reference.spelled() for reference in unresolved_references(before, after, MANIFEST)]
    assert sorted(spelled) == [
        "cudagraph.backend_utils.not_there",
        "cudagraph.config.Absent",
        "cudagraph.missing_module",
        "cudagraph.nothing",
        "cudagraph.runner.Gone",
        "cudagraph.runner.Nope",
    ]
    # a reference the file already had is the user's, not the migration's
    assert unresolved_references(after, after, MANIFEST) == []
