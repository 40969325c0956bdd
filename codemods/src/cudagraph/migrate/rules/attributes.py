"""CG201: renamed attributes and methods of the model runner and the graph runners, only on the legacy API.

Driven by the ``attribute`` and ``method`` rows, each naming its owners (``cudagraph.engine.ModelRunner``,
``cudagraph.runner.BaseCudaGraphRunner``, ...). A member is renamed only where :mod:`.owners` ties it to one:

- ``receiver.old`` where the receiver is an instance of an owner (``self`` in a subclass, an annotated parameter, a
  variable assigned ``Owner(...)``), and ``getattr``/``hasattr``/``setattr``/``delattr(receiver, "old")``;
- ``patch.object(Owner, "old")`` and ``Owner.old`` on the class itself;
- method and class-attribute definitions in the body of a subclass of an owner (an override keeps overriding).

A method row's ``parameters`` go with its name (:mod:`.member_parameters`): a tied call's keyword argument, and an
override's parameter with its uses in the override's body, take the new parameter name; an override of a method whose
new name looks up an argument the old one required takes that argument as optional and looks it up when missing.

A member is never renamed elsewhere, and every place left alone is listed: a receiver known to be something else
(an engine's own ``graph_runner``), or of unknown type, as not tied (``-v``); in a file tied to a legacy engine
(:func:`.base.ties_to_legacy_engine`) a receiver of unknown type may well be that engine's ``ModelRunner``
(``worker.model_runner.init_device_graphs()`` through the project's own wrapper, ``getattr(self.model_runner,
"graph_runner", None)``), so it is listed for review with the new spelling instead ("maybe tied"). A name string on a
receiver tied to cudagraph's classes is rewritten exactly as the attribute access would be: it is that access,
spelled for ``getattr``. Where the file reaches no owner, :mod:`.same_spelled` lists the same places from the
:mod:`ast` tree, with the same words, and libcst is never run for this rule.
"""

from __future__ import annotations

import libcst as cst

from ..renames import RenameKind, RenameTable
from ..todo_comments import GuideSection
from .base import (
    LEGACY_ENGINE_FILE_KEY,
    Finding,
    MigrationCommand,
    QuickView,
    dotted_name,
    string_value,
    with_string_value,
)
from .member_parameters import (
    LOOKED_UP_WHEN_MISSING,
    keywords_renamed,
    parameter_renames,
    with_optional_lookup,
)
from .owners import (
    OWNER_METADATA,
    UNKNOWN,
    AsSpelled,
    OwnerResolver,
    canonicalizer_for,
    is_legacy_engine_name,
    legacy_engine_names,
    owner_rows,
)
from .same_spelled import (
    MEMBER_KINDS,
    NAME_STRING_CALLS,
    PATCH_OBJECT_CALLS,
    MemberScan,
    definition_message,
    maybe_message,
    not_tied_message,
)


class LegacyMembers(MigrationCommand):
    """Rename legacy attributes and methods where the receiver or class is tied to the row's owners."""

    METADATA_DEPENDENCIES = OWNER_METADATA
    TIED_TO_OWNERS = True

    @classmethod
    def owners_by_trigger(cls, table: RenameTable) -> dict[str, tuple[str, ...]]:
        """Each row's trigger text and its owners."""
        return {row.old: (*row.owners, *row.legacy_owners) for row in table.of_kind(*MEMBER_KINDS)}

    @classmethod
    def same_spelled(cls, view: QuickView) -> list[Finding]:
        """Every legacy member spelling of a file that reaches no owner, read off the :mod:`ast` tree."""
        scan = MemberScan(view.table, cls.CODE, tied_to_legacy_engine=view.tied_to_legacy_engine)
        scan.visit(view.tree)
        return scan.findings

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        """Load the rows, then rewrite."""
        self.rows = owner_rows(self.table, RenameKind.ATTRIBUTE, RenameKind.METHOD)
        self.owners = OwnerResolver(self, canonicalizer_for(self))
        self.spelled = OwnerResolver(self, AsSpelled())
        """The same questions answered without mapping legacy names to new ones: is the code still on the legacy
        engine's classes (a kept base, SGLang's own ``ModelRunner``)?"""
        self.legacy_names = legacy_engine_names(self.table)
        self.kept_bases = legacy_engine_names(self.table, shims=True)
        """A class still derived from one of these (as spelled) kept its legacy base: the migration refused to move
        it, so its overrides keep the names the legacy base calls."""
        self.legacy_owner_rows = {row.old: row.legacy_owners for row in self.table.of_kind(*MEMBER_KINDS)}
        self.parameters = {row.old: dict(row.parameters) for row in self.table.of_kind(*MEMBER_KINDS) if row.parameters}
        """Per method row with ``parameters``: legacy parameter name -> new one."""
        self.renamed_names: dict[int, str] = {}
        """Names of overrides' parameters (and their uses) to respell, by the id of their original node."""
        self.legacy_engine_file = bool(self.context.scratch.get(LEGACY_ENGINE_FILE_KEY))
        """Whether the file imports a legacy engine: an unknown receiver there is listed as maybe tied."""
        self.class_stack: list[cst.ClassDef] = []
        self.function_depth: list[int] = [0]
        return super().transform_module_impl(tree)

    def visit_Import(self, node: cst.Import) -> bool:
        """Module paths in imports are CG101's."""
        return False

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        """Module paths in imports are CG101's."""
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        """Definitions directly below belong to this class."""
        self.class_stack.append(node)
        self.function_depth.append(0)

    def leave_ClassDef(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> cst.ClassDef:
        """Leave the class."""
        self.class_stack.pop()
        self.function_depth.pop()
        return updated_node

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        """Plan the renames of an override's parameters; definitions below are locals of the function."""
        parameters = self.parameters.get(node.name.value)
        if parameters and self._overrides_ours(node.name.value):
            renames = parameter_renames(self, node, parameters)
            self.renamed_names.update(renames.by_node)
            for old, new in renames.kept:
                self.note(
                    node,
                    f"{self.rows[node.name.value][0]}'s parameter is {new}, but {new} already names something else "
                    f"in this override: its parameter stays {old}",
                )
        self.function_depth[-1] += 1

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        """Rename a method defined directly in the body of a subclass of an owner."""
        self.function_depth[-1] -= 1
        name = self._renamed_definition(updated_node.name, original_node)
        lookup = LOOKED_UP_WHEN_MISSING.get(original_node.name.value)
        if lookup is not None and name.value != original_node.name.value:
            adapted = with_optional_lookup(updated_node, lookup)
            if adapted is None:
                self.note(
                    original_node,
                    f"{name.value}() may be called without argument {lookup.position + 1} after self, which "
                    f"{original_node.name.value}() always had: give it a default and look it up when missing",
                )
            else:
                updated_node = adapted
        return updated_node.with_changes(name=name)

    def leave_Name(self, original_node: cst.Name, updated_node: cst.Name) -> cst.Name:
        """An override's parameter renamed with its method, and its uses in the override."""
        new = self.renamed_names.get(id(original_node))
        return updated_node if new is None else updated_node.with_changes(value=new)

    def leave_AnnAssign(self, original_node: cst.AnnAssign, updated_node: cst.AnnAssign) -> cst.AnnAssign:
        """A class-level attribute declaration (``graph_runner: Runner | None = None``) in an owner's subclass."""
        if isinstance(updated_node.target, cst.Name):
            return updated_node.with_changes(target=self._renamed_definition(updated_node.target, original_node))
        return updated_node

    def leave_Assign(self, original_node: cst.Assign, updated_node: cst.Assign) -> cst.Assign:
        """A class-level attribute default (``graph_runner = None``) in an owner's subclass."""
        targets = [
            target.with_changes(target=self._renamed_definition(target.target, original_node))
            if isinstance(target.target, cst.Name)
            else target
            for target in updated_node.targets
        ]
        return updated_node.with_changes(targets=targets)

    def leave_Attribute(self, original_node: cst.Attribute, updated_node: cst.Attribute) -> cst.Attribute:
        """``receiver.graph_runner`` -> ``receiver.decode_cuda_graph_runner`` where the receiver is an owner's."""
        row = self.rows.get(updated_node.attr.value)
        if row is None:
            return updated_node
        new, owners = row
        if not self._tied(original_node.value, owners, original_node, updated_node.attr.value, new):
            return updated_node
        self.edited()
        return updated_node.with_changes(attr=updated_node.attr.with_changes(value=new))

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        """``getattr(runner, "graph_runner")``, ``patch.object(Runner, "capture_one_batch_size")`` and friends; the
        keyword arguments of a renamed method's call (``capture_one_shape(shape=8)``)."""
        renamed_call = self._with_renamed_keywords(original_node, updated_node)
        if renamed_call is not None:
            return renamed_call
        callee = dotted_name(updated_node.func)
        short = callee.rpartition(".")[2] if callee else None
        if short not in NAME_STRING_CALLS | PATCH_OBJECT_CALLS or len(updated_node.args) < 2:
            return updated_node
        name_arg = updated_node.args[1]
        name = string_value(name_arg.value)
        row = self.rows.get(name) if name is not None else None
        if row is None or not isinstance(name_arg.value, cst.SimpleString):
            return updated_node
        new, owners = row
        if not self._tied(original_node.args[0].value, owners, original_node, str(name), new):
            return updated_node
        self.edited()
        new_arg = name_arg.with_changes(value=with_string_value(name_arg.value, new))
        return updated_node.with_changes(args=[updated_node.args[0], new_arg, *updated_node.args[2:]])

    def _with_renamed_keywords(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call | None:
        """The call with its keywords respelled when its method was renamed here and the row renames parameters."""
        before, after = original_node.func, updated_node.func
        if not (isinstance(before, cst.Attribute) and isinstance(after, cst.Attribute)):
            return None
        parameters = self.parameters.get(before.attr.value)
        if not parameters or after.attr.value == before.attr.value:
            return None
        return keywords_renamed(updated_node, parameters)

    def _overrides_ours(self, name: str) -> bool:
        """Whether a method ``name`` defined at this point is directly in the body of a subclass of one of its row's
        owners that kept no legacy base (what :meth:`_renamed_definition` renames), reporting nothing."""
        row = self.rows.get(name)
        if row is None or not self.class_stack or self.function_depth[-1]:
            return False
        class_def = self.class_stack[-1]
        everything = frozenset((*row[1], *self.legacy_owner_rows.get(name, ())))
        if not self.owners.ancestors(class_def) & everything:
            return False
        spelled = self.spelled.ancestors(class_def)
        legacy = any(is_legacy_engine_name(qualified, self.kept_bases) for qualified in spelled)
        return not legacy and not _defines(class_def, row[0])

    def _tied(
        self, receiver: cst.BaseExpression, owners: tuple[str, ...], where: cst.CSTNode, name: str, new: str
    ) -> bool:
        """Whether ``receiver`` is an instance or the class of one of ours that owns ``name``: then it is renamed.

        A receiver still tied to a legacy engine's class (a base the migration kept, SGLang's own ``ModelRunner``)
        keeps the legacy name, marked with a TODO giving the new spelling. Any other is left as written and listed:
        one of unknown type in a file tied to a legacy engine for review (maybe that engine's), else as not tied.
        """
        legacy_owners = self.legacy_owner_rows.get(name, ())
        everything = frozenset((*owners, *legacy_owners))
        types = self.owners.class_types(receiver)
        if types & everything:  # the class itself (Owner.old, patch.object(Owner, "old"))
            spelled = self.spelled.class_types(receiver)
        elif self.owners.is_local_class(receiver):  # a class of this file that is no owner's
            types, spelled = frozenset(), frozenset()
        else:
            instance = self.owners.instance_types(receiver)
            if instance is UNKNOWN:
                if self.legacy_engine_file:
                    self.maybe(where, maybe_message(name, new, legacy_owners))
                else:
                    self.skip(where, not_tied_message(name, owners))
                return False
            types, spelled = instance, self.spelled.instance_types(receiver) or frozenset()
        if not types & everything:
            self.skip(where, not_tied_message(name, owners))
            return False
        return self._on_ours(spelled, types & everything, where, name, new)

    def _on_ours(
        self,
        spelled: frozenset[str],
        owners_found: frozenset[str],
        where: cst.CSTNode,
        name: str,
        new: str,
        legacy: frozenset[str] | None = None,
    ) -> bool:
        """True when the code is on our classes; otherwise a TODO names the new spelling and the legacy class."""
        prefixes = self.legacy_names if legacy is None else legacy
        legacy_found = sorted(qualified for qualified in spelled if is_legacy_engine_name(qualified, prefixes))
        if not legacy_found:
            return True
        self.note(
            where,
            f"{name} stays while this code is on the legacy {legacy_found[0]}; on cudagraph's classes it is {new}",
            GuideSection.ENGINE_MEMBERS,
        )
        return False

    def _renamed_definition(self, name: cst.Name, where: cst.CSTNode) -> cst.Name:
        """``name`` renamed when it is defined directly in the body of a class that subclasses an owner."""
        row = self.rows.get(name.value)
        if row is None or not self.class_stack or self.function_depth[-1]:
            return name
        new, owners = row
        class_def = self.class_stack[-1]
        everything = frozenset((*owners, *self.legacy_owner_rows.get(name.value, ())))
        found = self.owners.ancestors(class_def) & everything
        if not found:
            self.skip(where, definition_message(name.value, class_def.name.value, owners))
            return name
        if not self._on_ours(self.spelled.ancestors(class_def), found, where, name.value, new, legacy=self.kept_bases):
            return name
        if _defines(class_def, new):
            self.note(where, f"{class_def.name.value} defines both {name.value} and {new}: merge them into {new}")
            return name
        self.edited()
        return name.with_changes(value=new)


def _defines(class_def: cst.ClassDef, name: str) -> bool:
    """Whether ``class_def``'s body defines ``name`` directly (a method, or a class attribute)."""
    body = class_def.body.body if isinstance(class_def.body, cst.IndentedBlock) else ()
    for statement in body:
        if isinstance(statement, cst.FunctionDef) and statement.name.value == name:
            return True
        if isinstance(statement, cst.SimpleStatementLine):
            for small in statement.body:
                targets = (
                    [target.target for target in small.targets]
                    if isinstance(small, cst.Assign)
                    else [small.target]
                    if isinstance(small, cst.AnnAssign)
                    else []
                )
                if any(isinstance(target, cst.Name) and target.value == name for target in targets):
                    return True
    return False
