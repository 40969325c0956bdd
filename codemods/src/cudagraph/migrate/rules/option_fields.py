"""CG404: config-class fields named like a legacy engine's options, in files tied to that engine: listed for review.

An RL or serving framework that drives SGLang keeps its launch settings in a config class of its own
(``disable_cuda_graph: bool = False``, ``cuda_graph_max_bs: int = 160``, ``cuda_graph_bs: list[int] | None``) and
renders the fields into SGLang's ``ServerArgs`` or command line. Nothing ties such a field to the legacy API (it is
the framework's own name, and may feed something else entirely), so it is never rewritten; but in a file tied to a
legacy engine (:func:`.base.ties_to_legacy_engine`) it is listed for review ("maybe tied") with the spelling
``cudagraph.config`` gives the option and its flag, so a migration of the launch code does not forget it.

A config class is a dataclass (``@dataclass``, ``@dataclasses.dataclass(...)``, pydantic's), an attrs class
(``@attr.s``, ``@attrs.define``/``frozen``/``mutable``) or a class of annotated fields (pydantic's ``BaseModel`` and
``BaseSettings``, ``msgspec.Struct``, ``NamedTuple``, ``TypedDict``); its fields are the annotated names of its body.
The legacy engine's own definition of the option (SGLang's ``ServerArgs`` body) is that engine's, not listed.

Report only, from the :mod:`ast` tree the run already has: this rule never runs libcst.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import PurePath

import libcst as cst

from ..renames import Rename, RenameKind, RenameTable
from .base import Finding, FindingKind, MigrationCommand, QuickView

__all__ = ["LegacyOptionFields", "field_message"]

CONFIG_DECORATORS = frozenset({"dataclass", "define", "frozen", "mutable", "attrs", "attr.s"})
"""Decorators (their last dotted part, or the whole ``attr.s``) that make a class of fields."""
CONFIG_BASES = frozenset({"BaseModel", "BaseSettings", "Struct", "NamedTuple", "TypedDict"})
"""Bases (their last dotted part) whose subclasses declare their fields as annotated class attributes."""


def field_message(class_name: str, row: Rename, flag: Rename | None) -> str:
    """What a config field named like a legacy option is listed with: the option's and flag's new spellings."""
    spelled = f'{row.new}="{row.value}"' if row.value is not None else " and ".join(row.targets)
    if flag is not None:
        flags = f"{flag.new} {flag.value}" if flag.value is not None else " and ".join(flag.targets)
        spelled = f"{spelled} (flags: {flags})"
    return (
        f"{class_name}.{row.old}: maybe tied: a config field named like the legacy engine's option; where it becomes "
        f"that option, cudagraph.config spells it {spelled}; left as written"
    )


class LegacyOptionFields(MigrationCommand):
    """List fields of config classes named like legacy options, in files tied to a legacy engine (never rewritten)."""

    @classmethod
    def triggers(cls, table: RenameTable) -> frozenset[str]:
        """The legacy option names."""
        return frozenset(row.old for row in table.of_kind(RenameKind.KWARG))

    @classmethod
    def quick_findings(cls, view: QuickView) -> list[Finding] | None:
        """The fields, read off the :mod:`ast` tree: this rule has nothing to rewrite anywhere."""
        if not view.tied_to_legacy_engine:
            return []
        rows = view.table.by_old(RenameKind.KWARG)
        flags = view.table.by_old(RenameKind.CLI_FLAG)
        own = _own_definitions(view.path, view.table)
        findings = []
        for class_def in _config_classes(view.tree):
            if class_def.name in own:
                continue
            for name, line in _fields(class_def):
                row = rows.get(name)
                if row is not None:
                    flag = flags.get("--" + name.replace("_", "-"))
                    findings.append(
                        Finding(FindingKind.MAYBE, cls.CODE, line, field_message(class_def.name, row, flag))
                    )
        return sorted(findings, key=lambda finding: finding.line)

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        """Never reached (:meth:`quick_findings` always answers); the tree as it is."""
        return tree


def _config_classes(tree: ast.Module) -> Iterator[ast.ClassDef]:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and (
            any(_decorator_name(decorator) in CONFIG_DECORATORS for decorator in node.decorator_list)
            or any(_last_part(base) in CONFIG_BASES for base in node.bases)
        ):
            yield node


def _fields(class_def: ast.ClassDef) -> Iterator[tuple[str, int]]:
    for statement in class_def.body:
        if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
            yield statement.target.id, statement.lineno


def _own_definitions(path: str, table: RenameTable) -> Mapping[str, str]:
    """The legacy owners defined by the file at ``path`` (SGLang's ``server_args.py`` defines ``ServerArgs``), by
    class name: their fields are the engine's own options."""
    parts = PurePath(path).with_suffix("").parts
    found = {}
    for row in table.of_kind(RenameKind.KWARG):
        for owner in row.legacy_owners:
            module, _, name = owner.rpartition(".")
            module_parts = tuple(module.split("."))
            if parts[-len(module_parts) :] == module_parts:
                found[name] = owner
    return found


def _decorator_name(decorator: ast.expr) -> str | None:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    dotted = _dotted(target)
    if dotted is None:
        return None
    return dotted if dotted in CONFIG_DECORATORS else dotted.rpartition(".")[2]


def _last_part(node: ast.expr) -> str | None:
    if isinstance(node, ast.Subscript):  # Struct[...], Generic bases
        node = node.value
    dotted = _dotted(node)
    return dotted.rpartition(".")[2] if dotted else None


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return f"{head}.{node.attr}" if head is not None else None
    return None
