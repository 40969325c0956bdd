"""CG401: legacy server-argument keywords in calls of the legacy API, driven by ``kwarg`` rows.

Only a call whose callee :mod:`.owners` ties to one of the row's owners (``cudagraph.config.resolve``, in any of its
legacy spellings) is rewritten here: another program's ``ServerArgs(disable_cuda_graph=...)`` has its own keyword of
the same name and is CG403's to list (:mod:`.engine_options`); a callee that cannot be resolved is left as written and
listed (``-v``).

Per row shape (see ``refactor/renames.toml``):

- plain rename: the keyword is renamed, the value kept;
- ``also`` (one legacy switch became one per phase): one keyword per target, each with the same value;
- ``value`` (a boolean switch became a valued option): ``=True`` becomes ``new="value"``, ``=False`` is dropped (it
  asked for nothing), anything else is left as written with a note, since its truth is only known at run time.

A keyword the call already passes is never passed twice: an identical value is dropped, a different one is left as
written with a note. :func:`rewrite_keywords` is that rewrite, shared with CG403.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import libcst as cst

from ..renames import Rename, RenameKind, RenameTable
from ..todo_comments import GuideSection
from .base import Finding, MigrationCommand, QuickView, splice
from .owners import OWNER_METADATA, OwnerResolver, canonicalizer_for
from .same_spelled import keyword_findings, keyword_message

__all__ = ["LegacyKeywords", "planned_options", "rewrite_keywords"]

_EMPTY_MODULE = cst.Module([])


class LegacyKeywords(MigrationCommand):
    """Rewrite legacy server-argument keywords in calls of the legacy API."""

    METADATA_DEPENDENCIES = OWNER_METADATA
    TIED_TO_OWNERS = True

    @classmethod
    def owners_by_trigger(cls, table: RenameTable) -> dict[str, tuple[str, ...]]:
        """Each row's trigger text and its owners."""
        return {f"{row.old}=": row.owners for row in table.of_kind(RenameKind.KWARG)}

    @classmethod
    def same_spelled(cls, view: QuickView) -> list[Finding]:
        """Every legacy keyword of a file that reaches no owner, read off the :mod:`ast` tree."""
        return keyword_findings(view.tree, view.table, cls.CODE)

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        """Load the rows, then rewrite."""
        self.rows = self.table.by_old(RenameKind.KWARG)
        self.owners = OwnerResolver(self, canonicalizer_for(self))
        return super().transform_module_impl(tree)

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        """Replace each legacy keyword argument by its per-phase form."""
        legacy = [
            arg.keyword.value for arg in updated_node.args if arg.keyword is not None and arg.keyword.value in self.rows
        ]
        if not legacy:
            return updated_node
        owners = frozenset(owner for name in legacy for owner in self.rows[name].owners)
        callee = self.owners.class_types(original_node.func)
        if not callee & owners:
            takers = frozenset(owner for name in legacy for owner in self.rows[name].legacy_owners)
            if not callee & takers:  # a legacy engine's ServerArgs/Engine is CG403's to list for review
                self.skip(original_node, keyword_message(legacy[0], owners))
            return updated_node
        return rewrite_keywords(self, original_node, updated_node, self.rows)


def rewrite_keywords(
    command: MigrationCommand, original: cst.Call, updated: cst.Call, rows: Mapping[str, Rename]
) -> cst.Call:
    """``updated`` with each keyword named in ``rows`` replaced by what its row says (see the module docstring).

    The caller has tied the call to the rows' owners. Each rewritten keyword counts as one edit of ``command``; one
    that cannot be rewritten (a value known only at run time, a conflict with a keyword already passed) stays as
    written with a note on ``command``, at ``original``.
    """
    items = [(arg.keyword.value if arg.keyword is not None else None, arg.value) for arg in updated.args]
    plan = planned_options(command, original, items, rows)
    if not plan:
        return updated
    replacements = {
        index: [updated.args[index].with_changes(keyword=cst.Name(name), value=value) for name, value in new]
        for index, new in plan.items()
    }
    return updated.with_changes(args=splice(updated.args, replacements))


def planned_options(
    command: MigrationCommand,
    at: cst.CSTNode,
    items: Sequence[tuple[str | None, cst.BaseExpression]],
    rows: Mapping[str, Rename],
) -> dict[int, list[tuple[str, cst.BaseExpression]]]:
    """For each ``(option name, value)`` of ``items`` (keywords of a call, keys of a dict) named in ``rows``, by
    index: the ``(name, value)`` pairs it becomes (empty: dropped). One that stays as written is absent, noted on
    ``command`` at ``at``; each planned one counts as one edit of ``command``.

    An option is never given twice: a replacement identical to one already given is dropped, a different one leaves
    the legacy option as written with a note.
    """
    passed = {name: _code(value) for name, value in items if name is not None and name not in rows}
    plan: dict[int, list[tuple[str, cst.BaseExpression]]] = {}
    for index, (name, value) in enumerate(items):
        row = rows.get(name) if name is not None else None
        if row is None:
            continue
        new_items = _replacement(command, at, value, row)
        if new_items is None:
            continue
        kept = []
        for new_name, new_value in new_items:
            code = _code(new_value)
            if new_name not in passed:
                passed[new_name] = code
                kept.append((new_name, new_value))
            elif passed[new_name] != code:
                command.note(
                    at,
                    f"{row.old}= conflicts with {new_name}={passed[new_name]}; left as written",
                    GuideSection.RUN_TIME_VALUES,
                )
                break
        else:
            plan[index] = kept
            command.edited()
    return plan


def _replacement(
    command: MigrationCommand, at: cst.CSTNode, value: cst.BaseExpression, row: Rename
) -> list[tuple[str, cst.BaseExpression]] | None:
    """The options ``row.old=value`` becomes (empty: dropped), or None where it stays as written (noted on
    ``command``)."""
    if row.value is None:
        # each target gets its own copy of the value: no node may occur twice in the tree later rules analyse
        return [(target, value.deep_clone()) for target in row.targets]
    literal = value.value if isinstance(value, cst.Name) else None
    if literal == "True":
        return [(target, cst.SimpleString(repr(row.value).replace("'", '"'))) for target in row.targets]
    if literal == "False":
        return []
    command.note(
        at,
        f"{row.old}={_code(value)} is not a literal True/False; set {row.new}= by hand",
        GuideSection.RUN_TIME_VALUES,
    )
    return None


def _code(node: cst.CSTNode) -> str:
    return _EMPTY_MODULE.code_for_node(node)
