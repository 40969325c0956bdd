"""CG102: dotted paths inside strings (``mock.patch("legacy.module.Name")``, ``importlib.import_module(...)``).

Driven by the ``module`` and ``symbol`` rows, the exports manifest and the legacy API data. Only a whole string that
is exactly a dotted path starting at a legacy module is looked at; prose is never touched.

- A **module path** is rewritten to the new module.
- A path to a **name** of the module moves only when the name does (a symbol row, or exported by the new module), and
  only where whoever resolves the string can use the new object the same way: a string names a class or function to
  be imported and then built or called, so it follows the name's construction contract
  (:mod:`cudagraph.migrate.handoffs`). A name that stays, or whose contract the new one breaks, is left with a TODO.
- A path to a **member** of a legacy class (``Class.method``, a private attribute: a hook or patch target) is never
  rewritten: the engine still builds its own runner, so a hook or patch moved to the new class would never reach it.
  Nor is a class path that the file uses as a **prefix** to build member paths (``f"{CLS}._capture_graph"``,
  ``CLS + ".replay"``). The TODO names the members the string reaches, what the hook registered under it (the
  function it decorates, or its value in a dict) reads off the runner, and which of those the new class lacks. The
  ``cudagraph.legacy`` shims are the exception: their classes are the new ones, so their member paths are renamed
  as the member rows say.
- A path to a member of **cudagraph's own class** under its own earlier name (``own_name`` rows:
  ``"cudagraph.runner.DecodeCudaGraphRunner.capture_one_shape"``) is that class's member under its new name: it is
  rewritten (the old name is only an alias that forwards to the new one).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType

import libcst as cst

from ..compat import ApiChecker
from ..exports import ClassApi
from ..handoffs import HandoffChecker
from ..legacy_api import load_legacy_api
from ..renames import RenameKind, RenameTable
from ..table_cache import per_table
from ..todo_comments import GuideSection
from .base import LegacyModuleMatcher, MigrationCommand, original_source, string_value, with_string_value
from .owners import owner_rows

_DOTTED_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")
_MEMBER_AFTER = re.compile(r"\.([A-Za-z_]\w*)")
_SHIM_PREFIX = "cudagraph."


class LegacyDottedStrings(MigrationCommand):
    """Rewrite string literals that spell a legacy module, or a legacy name that can move, to the new path."""

    @classmethod
    def triggers(cls, table: RenameTable) -> frozenset[str]:
        """Text that must occur in a file for this rule to have anything to do: a legacy path opening a string."""
        starts = (*table.modules, *own_member_paths(table))
        return frozenset(f"{quote}{start}" for start in starts for quote in "\"'")

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        """Set up the matcher (absolute paths only: a string has no package to be relative to), and find the names
        bound to strings that the file extends into member paths."""
        self.matcher = LegacyModuleMatcher(self.table, None).for_file(*original_source(self.context, tree))
        self.members = owner_rows(self.table, RenameKind.ATTRIBUTE, RenameKind.METHOD)
        self.own_members = own_member_paths(self.table)
        self.handoffs = HandoffChecker(ApiChecker(self.table, self.exports, load_legacy_api()))
        finder = self.finder = _PrefixUses()
        tree.visit(finder)
        self.prefix_members = finder.members_by_string
        self.bare_names = finder.bare_names
        return super().transform_module_impl(tree)

    def leave_SimpleString(self, original_node: cst.SimpleString, updated_node: cst.SimpleString) -> cst.SimpleString:
        """``"legacy.mod"`` -> ``"new.mod"``; ``"legacy.mod.Old"`` -> ``"new.mod.New"`` where it can move."""
        value = string_value(updated_node)
        if value is None or not _DOTTED_PATH.fullmatch(value) or id(original_node) in self.finder.pieces:
            return updated_node  # a piece of a longer string names something else: the inventory lists that one
        own = self.own_members.get(value)
        if own is not None:
            self.edited()
            return with_string_value(updated_node, own)
        match = self.matcher.match(value)
        if match is None:
            return updated_node
        if not match.rest:
            fetched = self._fetched_names(match.row.old, match.row.new)
            if fetched:
                self.note(
                    original_node,
                    f"{value}: this file fetches {', '.join(fetched)} from it by name (getattr or an import-string "
                    f"helper), which {match.row.new} does not hand out the same way; left as written",
                    GuideSection.HANDOFFS,
                )
                return updated_node
            self.edited()
            return with_string_value(updated_node, match.row.new)
        symbol = self.table.symbol(match.row.old, match.rest[0])
        if symbol is not None:
            head = symbol.new
        elif self.exports.exports(match.row.new, match.rest[0]):
            head = f"{match.row.new}.{match.rest[0]}"
        else:
            self.note(
                original_node,
                f"{value}: {match.row.new} has no {match.rest[0]}; left as written",
                GuideSection.NAMES_THAT_STAY,
            )
            return updated_node
        legacy = f"{match.row.old}.{match.rest[0]}"
        reached = [*match.rest[1:2], *self.prefix_members.get(id(original_node), ())]
        hook_reads = self.finder.reads_of_hook(original_node) if match.rest[1:] else frozenset()
        if legacy.startswith(_SHIM_PREFIX):
            new_path = ".".join([head, *self._members(head, match.rest[1:])])
        elif reached:
            message = self._member_message(value, legacy, head, reached, hook_reads)
            self.note(original_node, message, GuideSection.MEMBER_STRINGS)
            return updated_node
        elif problems := self.handoffs.value_problems(head, legacy):
            self.note(original_node, f"{value}: {'; '.join(problems)}", GuideSection.HANDOFFS)
            return updated_node
        else:
            new_path = head
        self.edited()
        return with_string_value(updated_node, new_path)

    def _fetched_names(self, old_module: str, new_module: str) -> list[str]:
        """Names of the legacy module that the file spells as bare strings (``getattr(module, "CudaGraphRunner")``)
        and that the new module lacks under that name, or hands out with another construction contract."""
        legacy_api = self.handoffs.legacy
        fetched = []
        for name in sorted(self.bare_names):
            legacy = f"{old_module}.{name}"
            known = legacy in legacy_api.classes or legacy in legacy_api.functions
            if self.table.symbol(old_module, name) is None and not known:
                continue
            if not self.exports.exports(new_module, name) or self.handoffs.value_problems(
                f"{new_module}.{name}", legacy
            ):
                fetched.append(name)
        return fetched

    def _member_message(
        self, value: str, legacy: str, new: str, reached: list[str], hook_reads: frozenset[str] = frozenset()
    ) -> str:
        short_old, short_new = legacy.rpartition(".")[2], new.rpartition(".")[2]
        api = self.exports.api(new)
        renames = self.handoffs.member_renames(new)
        members = list(dict.fromkeys(reached))
        lacking = [
            member
            for member in members
            if not (isinstance(api, ClassApi) and api.has_member(renames.get(member, member)))
        ]
        became = [f"{member} -> {short_new}.{renames[member]}" for member in members if member in renames]
        parts = [
            f"{value} reaches {short_old}'s {', '.join(members)}, a hook or patch target on the engine's own runner "
            f"class (now {short_new}): not rewritten"
        ]
        legacy_class = self.handoffs.legacy.classes.get(legacy)
        runner_reads = sorted(hook_reads & legacy_class.members) if legacy_class is not None else []
        if runner_reads:
            parts.append(f"the hook registered here reads the runner's {', '.join(runner_reads)}")
            lacking.extend(
                read
                for read in runner_reads
                if read not in lacking and not (isinstance(api, ClassApi) and api.has_member(renames.get(read, read)))
            )
        if lacking:
            parts.append(f"{short_new} has no {', '.join(lacking)}")
        if became:
            parts.append(f"renamed: {', '.join(became)}")
        return "; ".join(parts)

    def _members(self, owner: str, parts: tuple[str, ...]) -> list[str]:
        """``parts`` after the class ``owner``: the first is renamed when ``owner`` owns that member."""
        if not parts:
            return []
        row = self.members.get(parts[0])
        first = row[0] if row is not None and owner in row[1] else parts[0]
        return [first, *parts[1:]]


@per_table
def own_member_paths(table: RenameTable) -> Mapping[str, str]:
    """``owner.old`` -> ``owner.new`` for every owner of every row of cudagraph's own earlier member names."""
    return MappingProxyType(
        {
            f"{owner}.{row.old}": f"{owner}.{row.new}"
            for row in table.of_kind(RenameKind.ATTRIBUTE, RenameKind.METHOD)
            if row.own_name
            for owner in row.owners
        }
    )


class _PrefixUses(cst.CSTVisitor):
    """What the file does with its strings: those bound to a name it extends into member paths (``CLS = "a.B"`` with
    ``f"{CLS}.method"`` or ``CLS + ".method"``), those that are one identifier (a name ``getattr`` may fetch), and the
    hooks registered under a string (a decorator's first argument, a dict key) with what they read off their
    parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.strings_by_name: dict[str, list[cst.SimpleString]] = {}
        self.members_by_name: dict[str, list[str]] = {}
        self.bare_names: set[str] = set()
        """Strings of the file that are one identifier (a name a ``getattr`` may fetch)."""
        self.pieces: set[int] = set()
        """Ids of the literals that are pieces of a longer string (adjacent literals, or ``"a" + "b"``)."""
        self.reads_by_function: dict[str, frozenset[str]] = {}
        self.hook_reads: dict[int, frozenset[str]] = {}
        self.hook_names: dict[int, str] = {}

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        value = string_value(node)
        if value is not None and value.isidentifier():
            self.bare_names.add(value)

    def visit_ConcatenatedString(self, node: cst.ConcatenatedString) -> None:
        self.pieces.update(id(part) for part in (node.left, node.right) if isinstance(part, cst.SimpleString))

    @property
    def members_by_string(self) -> dict[int, tuple[str, ...]]:
        """Id of each string bound to a name extended into member paths -> those members."""
        return {
            id(string): tuple(self.members_by_name[name])
            for name, strings in self.strings_by_name.items()
            if name in self.members_by_name
            for string in strings
        }

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        reads = _parameter_reads(node)
        self.reads_by_function[node.name.value] = reads
        for decorator in node.decorators:
            call = decorator.decorator
            if isinstance(call, cst.Call) and call.args and isinstance(call.args[0].value, cst.SimpleString):
                self.hook_reads[id(call.args[0].value)] = reads

    def visit_DictElement(self, node: cst.DictElement) -> None:
        if isinstance(node.key, cst.SimpleString) and isinstance(node.value, cst.Name):
            self.hook_names[id(node.key)] = node.value.value

    def reads_of_hook(self, string: cst.SimpleString) -> frozenset[str]:
        """Attributes the hook registered under ``string`` (decorated with it, or its dict value) reads off its
        parameters."""
        if id(string) in self.hook_reads:
            return self.hook_reads[id(string)]
        return self.reads_by_function.get(self.hook_names.get(id(string), ""), frozenset())

    def visit_Assign(self, node: cst.Assign) -> None:
        if isinstance(node.value, cst.SimpleString) and len(node.targets) == 1:
            target = node.targets[0].target
            if isinstance(target, cst.Name):
                self.strings_by_name.setdefault(target.value, []).append(node.value)

    def visit_FormattedString(self, node: cst.FormattedString) -> None:
        for before, after in zip(node.parts, node.parts[1:], strict=False):
            if (
                isinstance(before, cst.FormattedStringExpression)
                and isinstance(before.expression, cst.Name)
                and isinstance(after, cst.FormattedStringText)
                and (member := _MEMBER_AFTER.match(after.value))
            ):
                self.members_by_name.setdefault(before.expression.value, []).append(member.group(1))

    def visit_BinaryOperation(self, node: cst.BinaryOperation) -> None:
        literals = (cst.SimpleString, cst.ConcatenatedString, cst.FormattedString)
        if isinstance(node.operator, cst.Add) and isinstance(node.left, literals) and isinstance(node.right, literals):
            self.pieces.update(id(part) for part in (node.left, node.right) if isinstance(part, cst.SimpleString))
        if isinstance(node.operator, cst.Add) and isinstance(node.left, cst.Name):
            text = string_value(node.right)
            member = _MEMBER_AFTER.match(text) if text is not None else None
            if member is not None:
                self.members_by_name.setdefault(node.left.value, []).append(member.group(1))


def _parameter_reads(function: cst.FunctionDef) -> frozenset[str]:
    """Attribute names ``function`` reads off its own parameters (``runner.device`` in an around-hook)."""
    parameters = {param.name.value for param in (*function.params.posonly_params, *function.params.params)}
    reads: set[str] = set()

    class _Reads(cst.CSTVisitor):
        def visit_Attribute(self, node: cst.Attribute) -> None:
            if isinstance(node.value, cst.Name) and node.value.value in parameters:
                reads.add(node.attr.value)

    function.body.visit(_Reads())
    return frozenset(reads)
