"""CG402: legacy command-line flags, driven by ``cli_flag`` rows: listed always, rewritten only when asked.

A flag string in code is usually *another program's* command line (a test launching a server, a benchmark script),
and that program decides which flags it accepts: rewriting ``"--cuda-graph-max-bs"`` in an argv list makes the
launched server reject it. So argv candidates (elements of list/tuple/set literals, and command strings passed to
``subprocess``/``os.system``/``shlex.split``) are only *listed* unless the run is given ``--rewrite-argv``.

A program's own flag *definitions* (``add_argument``, ``click.option``, ``dataclasses.field(metadata=...)``) are never
rewritten: each is reported with the advice to define the flags with ``cudagraph.config.add_cli_args``.

When rewriting: a boolean switch that became a valued option expands to two elements
(``"--enable-breakable-cuda-graph"`` -> ``"--prefill-cuda-graph-backend", "breakable"``), a switch that became one per
phase to one element per phase, ``"--old=value"`` keeps its value, a comment stays with the element it preceded, and
an element already present is not written twice.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence

import libcst as cst

from ..renames import Rename, RenameKind, RenameTable
from .base import (
    Finding,
    FindingKind,
    MigrationCommand,
    QuickView,
    dotted_name,
    splice,
    string_value,
    with_string_value,
)

REWRITE_ARGV_KEY = "cudagraph.migrate.rewrite_argv"
"""``CodemodContext.scratch`` key: true when argv lists and command strings are to be rewritten."""

_DEFINITION_CALLS = frozenset({"add_argument", "option", "argument", "field"})
"""Callee names (last dotted part) that define a program's own flags."""
_COMMAND_CALLS = frozenset({"run", "Popen", "call", "check_call", "check_output", "system", "split", "popen"})
"""Callee names that take a command string (``subprocess.*``, ``os.system``, ``shlex.split``)."""
_WHITESPACE = re.compile(r"(\s+)")


class LegacyCliFlags(MigrationCommand):
    """List legacy flags in argument lists and command strings; rewrite them with ``--rewrite-argv``."""

    @classmethod
    def triggers(cls, table: RenameTable) -> frozenset[str]:
        """Text that must occur in a file for this rule to have anything to do."""
        return frozenset(row.old for row in table.of_kind(RenameKind.CLI_FLAG))

    @classmethod
    def quick_findings(cls, view: QuickView) -> list[Finding] | None:
        """Without ``--rewrite-argv`` this rule only reports: definitions and argv candidates, found with :mod:`ast`."""
        if view.rewrite_argv:
            return None
        flags = frozenset(view.table.by_old(RenameKind.CLI_FLAG))
        scan = _ArgvScan(flags, cls.CODE)
        scan.visit(view.tree)
        return sorted(scan.findings, key=lambda finding: finding.line)

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        """Load the rows, then rewrite."""
        self.rows = self.table.by_old(RenameKind.CLI_FLAG)
        self.rewrite = bool(self.context.scratch.get(REWRITE_ARGV_KEY))
        self.calls: list[str] = []
        return super().transform_module_impl(tree)

    def visit_Call(self, node: cst.Call) -> None:
        """Track the callee: definitions are reported, command strings are candidates."""
        callee = dotted_name(node.func) or ""
        self.calls.append(callee.rpartition(".")[2])
        if self.calls[-1] in _DEFINITION_CALLS:
            for flag in self._flags_in(node):
                self.note(node, f"defines legacy flag {flag}: define the flags with cudagraph.config.add_cli_args")

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        """Leave the call."""
        self.calls.pop()
        return updated_node

    def leave_List(self, original_node: cst.List, updated_node: cst.List) -> cst.List:
        """Argument lists."""
        return updated_node.with_changes(elements=self._rewrite(original_node, updated_node.elements))

    def leave_Tuple(self, original_node: cst.Tuple, updated_node: cst.Tuple) -> cst.Tuple:
        """Argument tuples."""
        return updated_node.with_changes(elements=self._rewrite(original_node, updated_node.elements))

    def leave_Set(self, original_node: cst.Set, updated_node: cst.Set) -> cst.Set:
        """Flag sets."""
        return updated_node.with_changes(elements=self._rewrite(original_node, updated_node.elements))

    def leave_SimpleString(self, original_node: cst.SimpleString, updated_node: cst.SimpleString) -> cst.SimpleString:
        """A command string passed to ``subprocess``/``os.system``/``shlex.split``."""
        if not self.calls or self.calls[-1] not in _COMMAND_CALLS:
            return updated_node
        text = string_value(updated_node)
        if text is None or not _WHITESPACE.search(text.strip()):
            return updated_node
        tokens = _WHITESPACE.split(text)
        flags = [token for token in tokens if token.partition("=")[0] in self.rows]
        if not flags:
            return updated_node
        if not self.rewrite:
            self.note(
                original_node, f"command string passes legacy flag(s) {', '.join(flags)}; --rewrite-argv rewrites"
            )
            return updated_node
        rewritten = [" ".join(self._replacement_texts(token)) or token for token in tokens]
        self.edited(len(flags))
        return with_string_value(updated_node, "".join(rewritten))

    def _rewrite(self, original: cst.CSTNode, elements: Sequence[cst.BaseElement]) -> list[cst.BaseElement]:
        if self.calls and self.calls[-1] in _DEFINITION_CALLS:
            return list(elements)
        texts_in_list = [_element_text(element) for element in elements]
        present = {text for text in texts_in_list if text is not None}
        replacements: dict[int, list[cst.BaseElement]] = {}
        found: list[str] = []
        for index, element in enumerate(elements):
            text = texts_in_list[index]
            targets = self._replacement_texts(text) if text is not None else []
            if not targets:
                continue
            assert isinstance(element, cst.Element) and isinstance(element.value, cst.SimpleString)
            found.append(str(text))
            if not self.rewrite:
                continue
            following = texts_in_list[index + 1] if index + 1 < len(texts_in_list) else None
            used_as_switch = following is None or following.startswith("-")
            if used_as_switch:  # two legacy switches may become the same new one: never write it twice
                targets = [target for target in targets if target not in present or not target.startswith("-")]
            present.update(targets)
            replacements[index] = [element.with_changes(value=with_string_value(element.value, t)) for t in targets]
            self.edited()
        if found and not self.rewrite:
            self.candidate(original, f"argument list passes legacy flag(s) {', '.join(found)}")
        return splice(list(elements), replacements) if replacements else list(elements)

    def _replacement_texts(self, text: str) -> list[str]:
        """What one argv element becomes (empty: not a legacy flag)."""
        flag, equals, attached = text.partition("=")
        row: Rename | None = self.rows.get(flag)
        if row is None:
            return []
        if equals:
            if row.value is not None or row.also:
                return []  # a switch never carries "=value"; leave the odd spelling to the user
            return [f"{row.new}={attached}"]
        return [*row.targets, *([row.value] if row.value is not None else [])]

    def _flags_in(self, call: cst.Call) -> list[str]:
        flags = []
        for arg in call.args:
            text = string_value(arg.value)
            if text is not None and text.partition("=")[0] in self.rows:
                flags.append(text)
        return flags


def _element_text(element: cst.BaseElement) -> str | None:
    if isinstance(element, cst.Element) and isinstance(element.value, cst.SimpleString):
        return string_value(element.value)
    return None


class _ArgvScan(ast.NodeVisitor):
    """The reporting half of :class:`LegacyCliFlags` over an :mod:`ast` tree: the same findings, no rewrite."""

    def __init__(self, flags: frozenset[str], code: str) -> None:
        self.flags = flags
        self.code = code
        self.calls: list[str] = []
        self.findings: list[Finding] = []

    def _is_flag(self, node: ast.AST) -> str | None:
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and node.value.partition("=")[0] in self.flags
        ):
            return node.value
        return None

    def visit_Call(self, node: ast.Call) -> None:
        callee = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        self.calls.append(callee)
        if callee in _DEFINITION_CALLS:
            for arg in node.args:
                flag = self._is_flag(arg)
                if flag is not None:
                    message = f"defines legacy flag {flag}: define the flags with cudagraph.config.add_cli_args"
                    self.findings.append(Finding(FindingKind.TODO, self.code, node.lineno, message))
        elif callee in _COMMAND_CALLS:
            for arg in node.args:
                if (
                    isinstance(arg, ast.Constant)
                    and isinstance(arg.value, str)
                    and _WHITESPACE.search(arg.value.strip())
                ):
                    found = [token for token in _WHITESPACE.split(arg.value) if token.partition("=")[0] in self.flags]
                    if found:
                        message = f"command string passes legacy flag(s) {', '.join(found)}"
                        self.findings.append(Finding(FindingKind.ARGV, self.code, arg.lineno, message))
        self.generic_visit(node)
        self.calls.pop()

    def _sequence(self, node: ast.List | ast.Tuple | ast.Set) -> None:
        if not (self.calls and self.calls[-1] in _DEFINITION_CALLS):
            found = [flag for flag in map(self._is_flag, node.elts) if flag is not None]
            if found:
                message = f"argument list passes legacy flag(s) {', '.join(found)}"
                self.findings.append(Finding(FindingKind.ARGV, self.code, node.lineno, message))
        self.generic_visit(node)

    visit_List = visit_Tuple = visit_Set = _sequence


def _constant_text(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None
