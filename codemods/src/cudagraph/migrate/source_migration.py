"""Migrate one file's source: a cheap text prefilter, one parse, the selected rules in order, then the post-condition.

Pure function of (source, path, rules, table, exports): no file I/O here, so tests, the CLI workers and the example
share it. The rules run as one :class:`libcst.codemod.Codemod` on a single parse; a file that mentions nothing a rule
looks for is skipped before parsing, which is what keeps a run over a large tree fast. Every result must pass
:func:`cudagraph.migrate.verify.unresolved_references` (it parses, and each ``cudagraph`` name it newly imports
exists), or the file is reported as failed and never written.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import libcst as cst
from libcst.codemod import Codemod, CodemodContext

from .exports import ExportsManifest, load_exports
from .options import RunOptions
from .python_ast import parse_ast
from .reexports import imported_names
from .renames import RenameTable
from .rules import Rule, rule_prefilter
from .rules.base import (
    LEGACY_ENGINE_FILE_KEY,
    MOVE_SHARED_STATE_KEY,
    ORIGINAL_KEY,
    REWRITE_ENGINE_OPTIONS_KEY,
    Finding,
    QuickView,
)
from .rules.cli_flags import REWRITE_ARGV_KEY
from .rules.owners import REEXPORTS_KEY, Canonicalizer
from .verify import unresolved_references

__all__ = ["MigrationError", "SourceMigration", "UnparsableSourceError", "migrate_source"]


class MigrationError(Exception):
    """The file could not be migrated (it does not parse, a rule failed, or the result would not import)."""


class UnparsableSourceError(MigrationError):
    """The file does not parse (as Python, or as libcst reads it): no rule saw it."""


@dataclass
class SourceMigration:
    """The outcome of migrating one source text."""

    original: bytes
    migrated: bytes
    edits: dict[str, int] = field(default_factory=dict)
    """Rewritten occurrences per rule code (rules with none are absent)."""
    findings: list[Finding] = field(default_factory=list)
    """What the rules reported: legacy uses left for the user, names not tied to the legacy API, argv candidates."""
    parsed: bool = False
    """Whether the prefilter let the file through to the parser (which read it: a file that does not parse raises
    ``UnparsableSourceError``)."""

    @property
    def changed(self) -> bool:
        """Whether migration changed the text."""
        return self.migrated != self.original


class _RuleChain(Codemod):
    """The selected rules as one libcst codemod: each rule transforms the tree the previous one produced."""

    DESCRIPTION = "Rewrite legacy CUDA-graph names to the cudagraph packages."

    def __init__(
        self, context: CodemodContext, rules: Sequence[Rule], table: RenameTable, exports: ExportsManifest
    ) -> None:
        super().__init__(context)
        self.rules = rules
        self.table = table
        self.exports = exports
        self.result = SourceMigration(b"", b"", parsed=True)

    def transform_module(self, tree: cst.Module) -> cst.Module:
        """Run the chain; each rule manages its own metadata (see ``MigrationCommand.transform_module``), so the
        whole-tree copy libcst's default makes for a chain that reads no metadata itself is skipped."""
        return self.transform_module_impl(tree)

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        """Run every rule in order, collecting edits and findings."""
        for rule in self.rules:
            command = rule.command(self.context, self.table, self.exports)
            try:
                tree = command.transform_module(tree)
            except Exception as error:  # a rule bug must fail this file, not the run
                raise MigrationError(f"rule {rule.code} failed: {type(error).__name__}: {error}") from error
            if command.edits:
                self.result.edits[rule.code] = command.edits
            self.result.findings.extend(sorted(command.findings, key=lambda finding: finding.line))
        return tree


def migrate_source(
    source: bytes | str,
    path: str,
    rules: Sequence[Rule],
    table: RenameTable,
    options: RunOptions | None = None,
    exports: ExportsManifest | None = None,
) -> SourceMigration:
    """Run ``rules`` over ``source`` (the text of the file at ``path``; relative imports resolve against ``path``).

    Raises :class:`MigrationError` when the source does not parse, a rule fails, or the result would not pass the
    post-condition; nothing is half-applied since the caller writes only a complete result.
    """
    options = options or RunOptions()
    exports = exports or load_exports()
    original = source.encode("utf-8") if isinstance(source, str) else source
    text = original.decode("utf-8", errors="replace")
    markers = reexport_markers(options.reexports)
    active = rule_prefilter(tuple(rules), table).active(rules, text, path, table, markers)
    if not active:
        return SourceMigration(original, original)
    try:
        module_ast = parse_ast(original, filename=path)
    except SyntaxError as error:
        raise UnparsableSourceError(f"{path}:{error.lineno}:{error.offset}: does not parse: {error.msg}") from None
    reexports = _reexports(options.reexports)
    canonicalizer = Canonicalizer(table, exports, reexports)
    view = QuickView(
        module_ast,
        text,
        path,
        table,
        options.rewrite_argv,
        imported_names(module_ast, canonicalizer.canonical),
        rewrite_engine_options=options.rewrite_engine_options,
    )
    findings: list[Finding] = []
    transforming = []
    for rule in active:
        try:
            quick = rule.command.quick_findings(view)
        except Exception as error:  # a rule bug must fail this file, not the run
            raise MigrationError(f"{path}: rule {rule.code} failed: {type(error).__name__}: {error}") from error
        if quick is None:
            transforming.append(rule)
        else:
            findings.extend(quick)
    if not transforming:
        return SourceMigration(original, original, findings=findings, parsed=True)
    try:
        tree = cst.parse_module(original)
    except cst.ParserSyntaxError as error:
        raise UnparsableSourceError(
            f"{path}:{error.raw_line}:{error.raw_column}: does not parse: {error.message}"
        ) from None
    scratch = {
        REWRITE_ARGV_KEY: options.rewrite_argv,
        REWRITE_ENGINE_OPTIONS_KEY: options.rewrite_engine_options,
        MOVE_SHARED_STATE_KEY: options.move_shared_state,
        REEXPORTS_KEY: reexports,
        ORIGINAL_KEY: (tree, text),
        LEGACY_ENGINE_FILE_KEY: view.tied_to_legacy_engine,
    }
    context = CodemodContext(filename=path, scratch=scratch)
    chain = _RuleChain(context, transforming, table, exports)
    try:
        transformed = chain.transform_module(tree)
    except MigrationError as error:
        raise MigrationError(f"{path}: {error}") from error
    # a chain that edited nothing hands the parsed tree back, whose code is the source (libcst round-trips it)
    migrated = original if transformed is tree else transformed.bytes
    result = chain.result
    result.original, result.migrated = original, migrated
    result.findings = sorted([*findings, *result.findings], key=lambda finding: (finding.code, finding.line))
    if result.changed:
        _check_postcondition(module_ast, migrated, path, exports)
    return result


@functools.lru_cache(maxsize=4)
def reexport_markers(pairs: tuple[tuple[str, str], ...]) -> frozenset[str]:
    """The last part of every project module that re-exports a legacy name (``server_args``)."""
    return frozenset(qualified.rpartition(".")[0].rpartition(".")[2] for qualified, _ in pairs)


@functools.lru_cache(maxsize=4)
def _reexports(pairs: tuple[tuple[str, str], ...]) -> Mapping[str, str]:
    return dict(pairs)


def _check_postcondition(original: ast.Module, migrated: bytes, path: str, exports: ExportsManifest) -> None:
    try:
        missing = unresolved_references(original, migrated, exports, path)
    except SyntaxError as error:
        raise MigrationError(f"{path}: the migrated text would not parse ({error.msg}, line {error.lineno})") from None
    if missing:
        names = ", ".join(f"{reference.spelled()} (line {reference.line})" for reference in missing)
        raise MigrationError(f"{path}: the migrated text would import names that do not exist: {names}; left untouched")
