"""CG402: legacy command-line flags, driven by ``cli_flag`` rows: listed always, rewritten only when asked.

A flag string in code is usually *another program's* command line (a test launching a server, a benchmark script, an
RL driver handing a command to its own launcher), and that program decides which flags it accepts: rewriting
``"--cuda-graph-max-bs"`` in an argv list makes the launched server reject it. So every command-like place is only
*listed* unless the run is given ``--rewrite-argv``:

- elements of list/tuple/set literals (argv lists);
- any string literal holding a legacy flag as a whitespace-separated word (a command string, wherever it goes: to
  ``subprocess``, to a project's own ``launch(...)`` helper, into a variable), and a string that is one flag;
- the literal parts of an f-string (listed only: the flag's surroundings are only known at run time).

Text for a person is not a command line and is left alone: docstrings and other bare string statements, messages of
logging and ``print`` calls, of exceptions, ``raise`` and ``assert``, and ``help=`` texts. A program's own flag
*definitions* (``add_argument``, ``click.option``, ``dataclasses.field(metadata=...)``) are never rewritten, not even
with ``--rewrite-argv``, and no comment is written at them (the report's "needs a manual step" holds only places that
carry a ``# TODO(cudagraph-migrate)`` comment, and a program's own option definitions are not the tool's to mark). A
definition in SGLang's parser (:mod:`.flag_definitions`: ``ServerArgs.add_cli_args`` or an override of it, a parser
handed to it) is listed for review with the advice to define the flags with ``cudagraph.config.add_cli_args``; any
other parser's is another engine's own flag, listed only with ``-v`` as not tied, and given no advice.

When rewriting: a boolean switch that became a valued option expands to two words or elements
(``"--enable-breakable-cuda-graph"`` -> ``"--prefill-cuda-graph-backend", "breakable"``), a switch that became one per
phase to one per phase, ``"--old=value"`` keeps its value, a comment stays with the element it preceded, and a switch
already present is not written twice. What one string cannot hold (a lone flag string that becomes two arguments, a
string with escape sequences) stays listed.

Without ``--rewrite-argv`` the rule only reports, from the :mod:`ast` tree (no libcst work).
"""

from __future__ import annotations

import ast
import enum
import re
from collections.abc import Mapping, Sequence

import libcst as cst

from ..api_scan import ast_dotted_name
from ..python_ast import parse_ast
from ..renames import Rename, RenameKind, RenameTable
from .base import (
    ORIGINAL_KEY,
    Finding,
    FindingKind,
    MigrationCommand,
    QuickView,
    dotted_name,
    splice,
    string_value,
    with_string_value,
)
from .flag_definitions import DefinitionTies, parser_owners

REWRITE_ARGV_KEY = "cudagraph.migrate.rewrite_argv"
"""``CodemodContext.scratch`` key: true when argv lists and command strings are to be rewritten."""

_WHITESPACE = re.compile(r"(\s+)")
_PLACEHOLDER = "\0"
"""Stands for an f-string's replacement field when its literal parts are read as one text."""


class StringRole(enum.Enum):
    """Where a string stands when it is not a command line."""

    DEFINITION = "definition"
    """Inside a program's definition of its own flags: the definition is listed for review, never rewritten."""
    MESSAGE = "message"
    """Text for a person (a log line, an exception, a ``help=`` text): neither listed nor rewritten."""


_CALL_ROLES: Mapping[str, StringRole] = {
    **dict.fromkeys(("add_argument", "option", "argument", "field"), StringRole.DEFINITION),
    **dict.fromkeys(
        ("debug", "info", "warning", "warn", "error", "exception", "critical", "fatal", "log", "print", "echo"),
        StringRole.MESSAGE,
    ),
}
"""Callee names (last dotted part) whose arguments are not command lines: flag definitions, messages."""
_MESSAGE_CLASS_SUFFIXES = ("Error", "Exception", "Warning")
"""A callee named like this builds an exception or a warning: its arguments are messages."""
_MESSAGE_KEYWORDS = frozenset({"help"})
"""Keyword arguments that hold text for a person whatever the call."""

_DEFINITION_ADVICE = "define the flags with cudagraph.config.add_cli_args"


def call_role(callee: str) -> StringRole | None:
    """The role of the arguments of a call of ``callee`` (its last dotted part); None: they may be command lines."""
    role = _CALL_ROLES.get(callee)
    if role is None and callee.endswith(_MESSAGE_CLASS_SUFFIXES):
        return StringRole.MESSAGE
    return role


def _flag_row(rows: Mapping[str, Rename], token: str) -> Rename | None:
    return rows.get(token.partition("=")[0])


def _replacement_texts(rows: Mapping[str, Rename], token: str) -> list[str]:
    """What one argv word becomes (empty: not a legacy flag, or a spelling with no rewrite)."""
    flag, equals, attached = token.partition("=")
    row = rows.get(flag)
    if row is None:
        return []
    if equals:
        if row.value is not None or row.also:
            return []  # a switch never carries "=value"; leave the odd spelling to the user
        return [f"{row.new}={attached}"]
    return [*row.targets, *([row.value] if row.value is not None else [])]


def _rewritten(rows: Mapping[str, Rename], words: Sequence[str | None]) -> dict[int, list[str]]:
    """For each legacy flag among ``words`` (None: not a string), by index, the words it becomes.

    Two legacy switches may become the same new one (``--disable-cuda-graph`` and ``--disable-piecewise-cuda-graph``
    both turn prefill off): a switch already present is not written again.
    """
    present = {word for word in words if word is not None}
    result: dict[int, list[str]] = {}
    for index, word in enumerate(words):
        targets = _replacement_texts(rows, word) if word is not None else []
        if not targets:
            continue
        following = words[index + 1] if index + 1 < len(words) else None
        if following is None or following.startswith("-"):  # used as a switch
            targets = [target for target in targets if target not in present or not target.startswith("-")]
        present.update(targets)
        result[index] = targets
    return result


def _rewrite_command(rows: Mapping[str, Rename], text: str) -> tuple[str, int]:
    """``text`` with its legacy flags rewritten, keeping its whitespace; and how many flags were rewritten."""
    parts = _WHITESPACE.split(text)
    words, separators = parts[::2], parts[1::2]  # words[i + 1] follows separators[i]
    replacements = _rewritten(rows, [word or None for word in words])
    kept: list[tuple[str, str]] = []
    for index, word in enumerate(words):
        if index in replacements and not replacements[index]:
            continue  # a switch already present: dropped with the whitespace before it
        new = " ".join(replacements[index]) if index in replacements else word
        kept.append((separators[index - 1] if index and kept else "", new))
    return "".join(separator + word for separator, word in kept), len(replacements)


def _command_flags(rows: Mapping[str, Rename], text: str) -> list[str]:
    return [word for word in text.split() if _flag_row(rows, word) is not None]


def _sequence_flags(rows: Mapping[str, Rename], words: Sequence[str | None]) -> list[str]:
    return [word for word in words if word is not None and _flag_row(rows, word) is not None]


def _command_message(flags: Sequence[str]) -> str:
    return f"command string passes legacy flag(s) {', '.join(flags)}"


def _single_message(text: str) -> str:
    return f"string passes legacy flag {text}"


def _fstring_message(flags: Sequence[str]) -> str:
    return f"f-string passes legacy flag(s) {', '.join(flags)}: f-strings are listed, never rewritten"


def _list_message(flags: Sequence[str]) -> str:
    return f"argument list passes legacy flag(s) {', '.join(flags)}"


def _definition_message(flag: str) -> str:
    return f"defines legacy flag {flag}: {_DEFINITION_ADVICE}"


def _own_definition_message(flag: str) -> str:
    return f"defines legacy flag {flag}: this program's own parser, not SGLang's ServerArgs.add_cli_args; left alone"


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
        scan = _ArgvScan(view.table.by_old(RenameKind.CLI_FLAG), cls.CODE, _Ties(view.tree, view.path, view.table))
        scan.visit(view.tree)
        return sorted(scan.findings, key=lambda finding: finding.line)

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        """Load the rows, then rewrite."""
        self.rows = self.table.by_old(RenameKind.CLI_FLAG)
        self.rewrite = bool(self.context.scratch.get(REWRITE_ARGV_KEY))
        self.roles: list[StringRole | None] = [None]
        """The role of the strings being visited (innermost last)."""
        self.call_roles: list[StringRole | None] = []
        """The role each call being visited gives its arguments (innermost last)."""
        self.elements: set[int] = set()
        """Strings that are elements of a sequence: the sequence lists or rewrites them."""
        self.scopes: list[str] = []
        """Names of the classes and functions being visited (innermost last)."""
        original = self.context.scratch.get(ORIGINAL_KEY)
        text = original[1] if isinstance(original, tuple) else tree.code
        self.ties = _Ties(text, self.context.filename or "", self.table)
        return super().transform_module_impl(tree)

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        """Enter a scope."""
        self.scopes.append(node.name.value)

    def leave_ClassDef(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> cst.ClassDef:
        """Leave it."""
        self.scopes.pop()
        return updated_node

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        """Enter a scope."""
        self.scopes.append(node.name.value)

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        """Leave it."""
        self.scopes.pop()
        return updated_node

    def visit_Import(self, node: cst.Import) -> bool:
        """Nothing to see in imports."""
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        """Nothing to see in imports."""
        return False

    def visit_Expr(self, node: cst.Expr) -> bool:
        """A bare string statement (a docstring) is text for a person."""
        return not isinstance(node.value, (cst.SimpleString, cst.ConcatenatedString, cst.FormattedString))

    def visit_Raise(self, node: cst.Raise) -> None:
        """What is raised is a message."""
        self.roles.append(StringRole.MESSAGE)

    def leave_Raise(self, original_node: cst.Raise, updated_node: cst.Raise) -> cst.Raise:
        """Leave the message."""
        self.roles.pop()
        return updated_node

    def visit_Assert_msg(self, node: cst.Assert) -> None:
        """An assertion's message."""
        self.roles.append(StringRole.MESSAGE)

    def leave_Assert_msg(self, node: cst.Assert) -> None:
        """Leave the message."""
        self.roles.pop()

    def visit_Call(self, node: cst.Call) -> None:
        """Give the arguments their role; a flag definition is listed for review."""
        callee = (dotted_name(node.func) or "").rpartition(".")[2]
        own_role = call_role(callee)
        self.call_roles.append(self.roles[-1] or own_role)
        if own_role is StringRole.DEFINITION:
            flags = self._flags_in(node)
            parser = dotted_name(node.func.value) if isinstance(node.func, cst.Attribute) else None
            sglangs = bool(flags) and self.ties.ties(tuple(self.scopes), parser)
            for flag in flags:
                if sglangs:
                    self.candidate(node, _definition_message(flag))
                else:
                    self.skip(node, _own_definition_message(flag))

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        """Leave the call."""
        self.call_roles.pop()
        return updated_node

    def visit_Arg(self, node: cst.Arg) -> None:
        """An argument takes its call's role; a ``help=`` text is a message."""
        role = self.call_roles[-1] if self.call_roles else self.roles[-1]
        if role is None and node.keyword is not None and node.keyword.value in _MESSAGE_KEYWORDS:
            role = StringRole.MESSAGE
        self.roles.append(role)

    def leave_Arg(self, original_node: cst.Arg, updated_node: cst.Arg) -> cst.Arg:
        """Leave the argument."""
        self.roles.pop()
        return updated_node

    def visit_List(self, node: cst.List) -> None:
        """Its string elements are the list's."""
        self._claim(node.elements)

    def visit_Tuple(self, node: cst.Tuple) -> None:
        """Its string elements are the tuple's."""
        self._claim(node.elements)

    def visit_Set(self, node: cst.Set) -> None:
        """Its string elements are the set's."""
        self._claim(node.elements)

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
        """A command string, or a string that is one flag, outside any sequence."""
        if self.roles[-1] is not None or id(original_node) in self.elements:
            return updated_node
        text = string_value(updated_node)
        flags = _command_flags(self.rows, text) if text is not None else []
        if text is None or not flags:
            return updated_node
        if text == flags[0]:
            return self._single(original_node, updated_node, text)
        if not self.rewrite:
            self.candidate(original_node, _command_message(flags))
            return updated_node
        if updated_node.raw_value != text:
            self.candidate(original_node, f"{_command_message(flags)}: it holds escape sequences; change it by hand")
            return updated_node
        rewritten, count = _rewrite_command(self.rows, text)
        if count < len(flags):
            kept = [flag for flag in flags if not _replacement_texts(self.rows, flag)]
            self.candidate(original_node, f"{_command_message(kept)} in a spelling with no rewrite; change it by hand")
        if not count:
            return updated_node
        self.edited(count)
        return with_string_value(updated_node, rewritten)

    def visit_FormattedString(self, node: cst.FormattedString) -> None:
        """An f-string's literal parts: listed, never rewritten."""
        if self.roles[-1] is not None:
            return
        text = "".join(part.value if isinstance(part, cst.FormattedStringText) else _PLACEHOLDER for part in node.parts)
        flags = _command_flags(self.rows, text)
        if flags:
            self.candidate(node, _fstring_message(flags))

    def _single(self, original: cst.SimpleString, updated: cst.SimpleString, text: str) -> cst.SimpleString:
        targets = _replacement_texts(self.rows, text) if self.rewrite else []
        if len(targets) == 1 and updated.raw_value == text:
            self.edited()
            return with_string_value(updated, targets[0])
        if not self.rewrite:
            self.candidate(original, _single_message(text))
        elif targets:
            becomes = " ".join(targets)
            self.candidate(original, f"{_single_message(text)}, which becomes {becomes}: more than one argument")
        else:
            self.candidate(original, f"{_single_message(text)} in a spelling with no rewrite; change it by hand")
        return updated

    def _claim(self, elements: Sequence[cst.BaseElement]) -> None:
        self.elements.update(
            id(element.value)
            for element in elements
            if isinstance(element, cst.Element) and isinstance(element.value, cst.SimpleString)
        )

    def _rewrite(self, original: cst.CSTNode, elements: Sequence[cst.BaseElement]) -> list[cst.BaseElement]:
        if self.roles[-1] is not None:
            return list(elements)
        words = [_element_text(element) for element in elements]
        flags = _sequence_flags(self.rows, words)
        if not flags:
            return list(elements)
        if not self.rewrite:
            self.candidate(original, _list_message(flags))
            return list(elements)
        replacements = _rewritten(self.rows, words)
        kept = [flag for flag in flags if not _replacement_texts(self.rows, flag)]
        if kept:
            self.candidate(original, f"{_list_message(kept)} in a spelling with no rewrite; change it by hand")
        new_elements: dict[int, list[cst.BaseElement]] = {}
        for index, targets in replacements.items():
            element = elements[index]
            assert isinstance(element, cst.Element) and isinstance(element.value, cst.SimpleString)
            new_elements[index] = [element.with_changes(value=with_string_value(element.value, t)) for t in targets]
            self.edited()
        return splice(list(elements), new_elements) if new_elements else list(elements)

    def _flags_in(self, call: cst.Call) -> list[str]:
        flags = []
        for arg in call.args:
            text = string_value(arg.value)
            if text is not None and _flag_row(self.rows, text) is not None:
                flags.append(text)
        return flags


def _element_text(element: cst.BaseElement) -> str | None:
    if isinstance(element, cst.Element) and isinstance(element.value, cst.SimpleString):
        return string_value(element.value)
    return None


class _ArgvScan(ast.NodeVisitor):
    """The reporting half of :class:`LegacyCliFlags` over an :mod:`ast` tree: the same findings, no rewrite."""

    def __init__(self, rows: Mapping[str, Rename], code: str, ties: _Ties) -> None:
        self.rows = rows
        self.code = code
        self.ties = ties
        self.scopes: list[str] = []
        self.roles: list[StringRole | None] = [None]
        self.elements: set[int] = set()
        self.findings: list[Finding] = []

    def _list(self, node: ast.expr | ast.stmt, message: str) -> None:
        """List a finding for review (this rule marks nothing as a manual step)."""
        self.findings.append(Finding(FindingKind.ARGV, self.code, node.lineno, message))

    def _within(self, role: StringRole | None, nodes: Sequence[ast.AST | None]) -> None:
        self.roles.append(role)
        for node in nodes:
            if node is not None:
                self.visit(node)
        self.roles.pop()

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        """A scope: its name keys the flag definitions in it."""
        self.scopes.append(node.name)
        self.generic_visit(node)
        self.scopes.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef  # type: ignore[assignment]

    def visit_Expr(self, node: ast.Expr) -> None:
        """A bare string statement (a docstring) is text for a person."""
        if not (isinstance(node.value, ast.JoinedStr) or _constant_text(node.value) is not None):
            self.generic_visit(node)

    def visit_Raise(self, node: ast.Raise) -> None:
        """What is raised is a message."""
        self._within(StringRole.MESSAGE, [node.exc, node.cause])

    def visit_Assert(self, node: ast.Assert) -> None:
        """An assertion's message."""
        self.visit(node.test)
        self._within(StringRole.MESSAGE, [node.msg])

    def visit_Call(self, node: ast.Call) -> None:
        """Give the arguments their role; a flag definition is listed for review."""
        self.visit(node.func)
        callee = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        own_role = call_role(callee)
        role = self.roles[-1] or own_role
        if own_role is StringRole.DEFINITION:
            parser = ast_dotted_name(node.func.value) if isinstance(node.func, ast.Attribute) else None
            for arg in node.args:
                flag = _constant_text(arg)
                if flag is None or _flag_row(self.rows, flag) is None:
                    continue
                if self.ties.ties(tuple(self.scopes), parser):
                    self._list(node, _definition_message(flag))
                else:
                    self.findings.append(
                        Finding(FindingKind.SKIP, self.code, node.lineno, _own_definition_message(flag))
                    )
        self._within(role, node.args)
        for keyword in node.keywords:
            keyword_role = StringRole.MESSAGE if role is None and keyword.arg in _MESSAGE_KEYWORDS else role
            self._within(keyword_role, [keyword.value])

    def _sequence(self, node: ast.List | ast.Tuple | ast.Set) -> None:
        self.elements.update(id(element) for element in node.elts if _constant_text(element) is not None)
        if self.roles[-1] is None:
            found = _sequence_flags(self.rows, [_constant_text(element) for element in node.elts])
            if found:
                self._list(node, _list_message(found))
        self.generic_visit(node)

    visit_List = visit_Tuple = visit_Set = _sequence

    def visit_Constant(self, node: ast.Constant) -> None:
        """A command string, or a string that is one flag, outside any sequence."""
        text = _constant_text(node)
        if text is None or self.roles[-1] is not None or id(node) in self.elements:
            return
        flags = _command_flags(self.rows, text)
        if flags:
            message = _single_message(text) if text == flags[0] else _command_message(flags)
            self._list(node, message)

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        """An f-string's literal parts: listed, never rewritten."""
        if self.roles[-1] is None:
            text = "".join(_constant_text(part) or _PLACEHOLDER for part in node.values)
            flags = _command_flags(self.rows, text)
            if flags:
                self._list(node, _fstring_message(flags))
        for part in node.values:
            if isinstance(part, ast.FormattedValue):
                self.visit(part.value)


class _Ties:
    """:class:`.flag_definitions.DefinitionTies` of a file, read only when a definition asks (most files define no
    legacy flag): from the :mod:`ast` tree, or from the file's text on the libcst path."""

    def __init__(self, source: ast.Module | str, path: str, table: RenameTable) -> None:
        self.source = source
        self.path = path
        self.table = table
        self._ties: DefinitionTies | None = None

    def ties(self, scopes: tuple[str, ...], parser: str | None) -> bool:
        """Whether a definition on ``parser`` inside ``scopes`` belongs to SGLang's parser."""
        if self._ties is None:
            tree = self.source if isinstance(self.source, ast.Module) else parse_ast(self.source)
            self._ties = DefinitionTies(tree, self.path, parser_owners(self.table))
        return self._ties.ties(scopes, parser)


def _constant_text(node: ast.AST) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None
