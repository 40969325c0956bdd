"""``cudagraph-migrate`` on released SGLang trees: what it writes imports, parses, leaves other programs alone, and
is idempotent. The trees come from ``python tests/realtrees/trees.py fetch``; ``nox -s realtrees`` fetches them and
runs these tests (``nox -s tests`` leaves them out: they take minutes). Without a tree they skip, saying why and what
to do.

"Legacy references" below are from-imports of a legacy module and ``import legacy.module`` statements, split into
those the packages can take over (a symbol row, or a name the new module exports) and those that must stay (a name
only the legacy module has, such as SGLang's private ``_allocate_decode_buffers``).
"""

from __future__ import annotations

import ast
import functools
import importlib
import re
import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cudagraph.migrate.exports import load_exports
from cudagraph.migrate.renames import RenameKind, load_renames
from cudagraph.migrate.rules.base import LegacyModuleMatcher
from cudagraph.migrate.verify import cudagraph_references

from .trees import TREES, RealTree

pytestmark = [pytest.mark.slow, pytest.mark.realtrees]

TABLE = load_renames()
EXPORTS = load_exports()
LEGACY_FLAGS = frozenset(TABLE.by_old(RenameKind.CLI_FLAG))
DEFINITION_CALLS = frozenset({"add_argument", "option", "argument", "field"})
TODO = "# TODO(cudagraph-migrate):"
MIGRATE = [str(Path(sys.executable).with_name("cudagraph-migrate")), "-j", "2", "--no-progress"]


@dataclass
class TreeFacts:
    """What the tests compare before and after, read with ``ast`` (independently of the codemods)."""

    movable: int = 0
    movable_marked: int = 0
    """Movable names left on the legacy import because the new API refused a use, each marked with a TODO."""
    staying: int = 0
    todos: int = 0
    unparsable: set[str] = field(default_factory=set)
    definitions: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    argv_flags: Counter[tuple[str, str]] = field(default_factory=Counter)


@functools.cache
def read_facts(root: Path) -> TreeFacts:
    facts = TreeFacts()
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        try:
            tree = ast.parse(path.read_bytes(), filename=relative)
        except SyntaxError:
            facts.unparsable.add(relative)
            continue
        matcher = LegacyModuleMatcher(TABLE, relative)
        lines = path.read_text(errors="replace").splitlines()
        facts.todos += sum(line.strip().startswith(TODO) for line in lines)
        retired = _imports_a_retired_module(tree, matcher)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                match = matcher.match(node.module or "", level=node.level) if (node.module or node.level) else None
                if match is not None and match.row.still_shipped and not retired:
                    continue  # SGLang still ships it: legacy only beside a retired module
                if match is not None and not match.rest:
                    for alias in node.names:
                        movable = TABLE.symbol(match.row.old, alias.name) or EXPORTS.exports(match.row.new, alias.name)
                        facts.movable += bool(movable)
                        facts.movable_marked += bool(movable) and _marked(lines, node.lineno)
                        facts.staying += not movable
            elif isinstance(node, ast.Import):
                facts.movable += sum(
                    1
                    for alias in node.names
                    if (m := matcher.match(alias.name)) and not m.rest and (retired or not m.row.still_shipped)
                )
            elif isinstance(node, ast.Call):
                callee = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                for arg in node.args:
                    if isinstance(arg, ast.Constant) and arg.value in LEGACY_FLAGS and callee in DEFINITION_CALLS:
                        facts.definitions[(relative, callee, arg.value)] += 1
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                for token in node.value.split():
                    if token.partition("=")[0] in LEGACY_FLAGS:
                        facts.argv_flags[(relative, token)] += 1
    return facts


def _imports_a_retired_module(tree: ast.Module, matcher: LegacyModuleMatcher) -> bool:
    """Whether the file imports a legacy module the legacy engine no longer ships (``still_shipped`` is false)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            paths = [(alias.name, 0) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            paths = [(module, node.level)] + [
                (f"{module}.{alias.name}" if module else alias.name, node.level) for alias in node.names
            ]
        else:
            continue
        for path, level in paths:
            match = matcher.match(path, level=level) if (path or level) else None
            if match is not None and not match.row.still_shipped:
                return True
    return False


def _marked(lines: list[str], line: int) -> bool:
    """Whether a TODO comment stands directly above the statement at ``line``."""
    index = line - 2
    while index >= 0 and lines[index].strip().startswith("#"):
        if lines[index].strip().startswith(TODO):
            return True
        index -= 1
    return False


@dataclass
class Migrated:
    """A migrated copy of a tree beside the pristine one, with the run's output."""

    tree: RealTree
    original: Path
    copy: Path
    result: subprocess.CompletedProcess[str]

    def changed_files(self) -> list[str]:
        return sorted(
            path.relative_to(self.copy).as_posix()
            for path in self.copy.rglob("*.py")
            if path.read_bytes() != (self.original / path.relative_to(self.copy)).read_bytes()
        )


@pytest.fixture(scope="module", params=TREES, ids=lambda tree: tree.name)
def migrated(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Migrated:
    tree: RealTree = request.param
    if not tree.ready():
        pytest.skip(tree.unavailable_reason())
    copy = tmp_path_factory.mktemp(tree.name) / "tree"
    shutil.copytree(tree.path(), copy)
    result = subprocess.run([*MIGRATE, str(copy)], capture_output=True, text=True, timeout=1200)
    return Migrated(tree, tree.path(), copy, result)


def test_the_run_succeeds_and_reports(migrated: Migrated) -> None:
    assert migrated.result.returncode == 0, migrated.result.stderr[-4000:]
    assert "failed: 0" in migrated.result.stderr


def test_legacy_references_that_can_move_are_gone_and_what_stays_is_reported(migrated: Migrated) -> None:
    before, after = read_facts(migrated.original), read_facts(migrated.copy)
    name = migrated.tree.name
    print(
        f"{name}: movable {before.movable} -> {after.movable} ({after.movable_marked} kept with a TODO: a use the "
        f"new API refused, or state shared with the legacy runner), staying {before.staying} -> {after.staying}, "
        f"TODO comments {after.todos}"
    )
    assert after.movable - after.movable_marked <= 0.02 * before.movable
    assert after.staying <= before.staying
    if after.staying:
        assert "not exported by" in migrated.result.stderr


def test_no_new_parse_failures(migrated: Migrated) -> None:
    assert read_facts(migrated.copy).unparsable <= read_facts(migrated.original).unparsable


def test_every_cudagraph_import_written_resolves_in_the_installed_packages(migrated: Migrated) -> None:
    unresolved = []
    for relative in migrated.changed_files():
        for reference in cudagraph_references((migrated.copy / relative).read_bytes(), relative):
            module = importlib.import_module(reference.module)
            if reference.name is not None and not hasattr(module, reference.name):
                unresolved.append(f"{relative}:{reference.line}: {reference.spelled()}")
    assert unresolved == []


def test_flag_definitions_and_other_programs_command_lines_are_untouched(migrated: Migrated) -> None:
    before, after = read_facts(migrated.original), read_facts(migrated.copy)
    assert after.definitions == before.definitions
    assert after.argv_flags == before.argv_flags  # no --rewrite-argv: argv is listed, never rewritten
    if before.argv_flags:
        assert "review: " in migrated.result.stderr


def test_every_manual_step_reported_is_marked_in_the_written_file(migrated: Migrated) -> None:
    """The report's contract: a ``todo:`` line names a statement of the written file with a TODO comment above it
    (a wrapped one reads as one comment); whatever the tool leaves unmarked is listed for review instead."""
    unmarked = []
    for entry in migrated.result.stderr.splitlines():
        if not entry.startswith("todo: "):
            continue
        path, number, _ = entry.removeprefix("todo: ").split(":", 2)
        lines = Path(path).read_text(errors="replace").splitlines()
        first = _statement_start(ast.parse("\n".join(lines)), int(number))
        if not (_marked(lines, int(number)) or _marked(lines, first)):
            unmarked.append(entry)
    assert unmarked == []


def _statement_start(tree: ast.Module, line: int) -> int:
    """The first line (decorators included) of the innermost statement that holds ``line``."""
    holding = [
        node for node in ast.walk(tree) if isinstance(node, ast.stmt) and node.lineno <= line <= (node.end_lineno or 0)
    ]
    if not holding:
        return line
    innermost = max(holding, key=lambda node: node.lineno)
    return min([innermost.lineno, *(decorator.lineno for decorator in getattr(innermost, "decorator_list", []))])


ACCOUNTED = re.compile(
    r"^accounted: (\d+) of (\d+) legacy spellings \((\d+) rewritten, (\d+) TODOs, (\d+) listed\)$", re.M
)
PLACE = re.compile(r"^(?:todo|listed): (.+?):(\d+):(\d+): (\S+) -> ", re.M)


def test_every_legacy_spelling_is_accounted_for(migrated: Migrated) -> None:
    """``accounted: N of N``, and each place listed once: every ``listed:`` line names a place of the written file
    that holds its spelling, and a legacy tree has spellings at all."""
    found = ACCOUNTED.search(migrated.result.stderr)
    assert found is not None, migrated.result.stderr[-2000:]
    accounted, total, rewritten, todos, listed = map(int, found.groups())
    assert accounted == total == rewritten + todos + listed
    edits = re.search(r"^migrated: (\d+) edit", migrated.result.stderr, re.M)
    assert edits is not None
    assert (rewritten > 0) == (int(edits.group(1)) > 0)  # what the rules rewrote is gone from the written files
    if not migrated.tree.already_migrated:
        assert total > rewritten  # SGLang's own definitions and the state its runner shares stay, each named
    places = PLACE.findall(migrated.result.stderr)
    assert len(places) == len(set(places))
    for path, line, column, spelling in places:
        lines = Path(path).read_text(errors="replace").splitlines()[int(line) - 1 : int(line) + 2]
        joined = re.sub(r"[\"'\s+\\]", "", "".join(lines))  # a spelling assembled from literals reads as one
        assert spelling in joined, (path, line, column, spelling)


def test_a_second_run_changes_nothing(migrated: Migrated) -> None:
    again = subprocess.run([*MIGRATE, "--check", str(migrated.copy)], capture_output=True, text=True, timeout=1200)
    assert again.returncode == 0, again.stdout[-2000:]


def test_an_already_migrated_tree_comes_out_unchanged_and_a_legacy_one_does_not(migrated: Migrated) -> None:
    if migrated.tree.already_migrated:
        assert migrated.changed_files() == []
    else:
        assert migrated.changed_files(), f"{migrated.tree.name} uses the legacy names: the migration must change it"


def test_migrated_test_files_still_collect_where_they_did(migrated: Migrated) -> None:
    tests = [relative for relative in migrated.changed_files() if Path(relative).name.startswith("test_")]
    if not tests:
        pytest.skip(
            f"nothing to check (nothing to do): the migration changed no test_*.py file of {migrated.tree.name}"
        )
    assert _collection_errors(migrated.copy, tests) <= _collection_errors(migrated.original, tests)


def _collection_errors(root: Path, tests: list[str]) -> set[str]:
    command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "--noconftest"]
    command += ["--continue-on-collection-errors", "-o", "addopts=", *tests]
    result = subprocess.run(command, cwd=root, capture_output=True, text=True, timeout=600)
    return {line.split()[1] for line in result.stdout.splitlines() if line.startswith("ERROR ")}
