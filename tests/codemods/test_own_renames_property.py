"""cudagraph's own earlier runner method names (``own_name`` rows), over generated overrides and receivers.

For any subclass of a runner class overriding an old name, and any mix of the override's uses of its parameter
(reads, an f-string, a rebinding), of names that only look like it (a tensor's ``.shape``, another call's ``shape=``
keyword, a nested function's own ``shape``) and of tied and untied receivers, the migration renames exactly the
method, its parameter where the row says so with every use of it, and the tied calls; leaves everything else as
written; and a second run changes nothing.
"""

from __future__ import annotations

import ast

from hypothesis import given, settings
from hypothesis import strategies as st

from cudagraph.migrate.options import RunOptions
from cudagraph.migrate.renames import load_renames
from cudagraph.migrate.rules import RULES
from cudagraph.migrate.source_migration import migrate_source

TABLE = load_renames()
OWN_ROWS = sorted((row for row in TABLE if row.own_name), key=lambda row: row.old)
OWNERS = sorted({owner.rpartition(".")[2] for row in OWN_ROWS for owner in row.owners})

PARAMETER_USES = (
    "self.seen.append({p})",
    "total = {p} + 1",
    'label = f"bucket {{{p}}}"',
    "{p} = int({p})",
)
"""Statements that use the override's parameter ``{p}``: each use is the bucket."""
LOOKALIKES = (
    "width = self.inputs.shape",
    "zeros = torch.zeros(shape=(1,))",
    "def inner(shape):\n            return shape",
)
"""Statements with names spelled like the parameter that are not it."""


@st.composite
def runner_files(draw: st.DrawFn) -> tuple[str, object, str]:
    row = draw(st.sampled_from(OWN_ROWS))
    owner = draw(st.sampled_from(OWNERS))
    parameter = dict(row.parameters).get("shape") and "shape"
    signature = "self, shape" if parameter else "self, batch, route"
    arguments = "shape" if parameter else "batch, route"
    statements = draw(st.lists(st.sampled_from(PARAMETER_USES + LOOKALIKES if parameter else LOOKALIKES), max_size=5))
    keyword = parameter and draw(st.booleans())
    super_call = f"super().{row.old}(shape=shape)" if keyword else f"super().{row.old}({arguments})"
    receiver = draw(st.sampled_from(("tied", "untied")))
    lines = [
        "import torch",
        "",
        f"from cudagraph.runner import {owner}",
        "",
        "",
        f"class Mine({owner}):",
        f"    def {row.old}({signature}):",
        *(f"        {statement.format(p='shape')}" for statement in statements),
        f"        return {super_call}",
        "",
        "",
        f"def use(runner: {owner}, other, batch):" if receiver == "tied" else "def use(runner, other, batch):",
        f"    return runner.{row.old}({'8' if parameter else 'batch, None'}), other.{row.old}()",
    ]
    return "\n".join(lines) + "\n", row, receiver


def _migrate(text: str) -> tuple[str, dict[str, int]]:
    result = migrate_source(text, "pkg/runner_user.py", RULES, TABLE, RunOptions())
    return result.migrated.decode(), result.edits


def _own_names(function: ast.FunctionDef) -> list[str]:
    """The names the function's own scope spells (not those of a nested function)."""
    found: list[str] = []
    stack: list[ast.AST] = list(function.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.FunctionDef):
            continue
        if isinstance(node, ast.Name):
            found.append(node.id)
        stack.extend(ast.iter_child_nodes(node))
    return found


def _method(tree: ast.Module) -> ast.FunctionDef:
    (cls,) = [node for node in tree.body if isinstance(node, ast.ClassDef)]
    (method,) = [node for node in cls.body if isinstance(node, ast.FunctionDef)]
    return method


@settings(deadline=None, max_examples=60)
@given(runner_files())
def test_property_an_override_and_its_parameter_move_and_nothing_else_does(case: tuple[str, object, str]) -> None:
    source, row, receiver = case
    migrated, edits = _migrate(source)
    before, after = ast.parse(source), ast.parse(migrated)
    old_method, new_method = _method(before), _method(after)
    assert new_method.name == row.new
    if row.new == "replay":  # callers of replay may leave the route out: the override looks it up first
        route = new_method.args.args[2]
        assert route.arg == "route" and len(new_method.args.defaults) == 1
        lookup = new_method.body.pop(0)
        assert isinstance(lookup, ast.If) and ast.unparse(lookup.test) == "route is None"
    renamed = dict(row.parameters)
    old_args = [arg.arg for arg in old_method.args.args]
    assert [arg.arg for arg in new_method.args.args] == [renamed.get(name, name) for name in old_args]
    old_names, new_names = _own_names(old_method), _own_names(new_method)
    assert new_names == [renamed.get(name, name) for name in old_names]  # every use, and only uses, respelled
    # what only looks like the parameter stays: attributes, other calls' keywords, a nested function's own name
    for lookalike in (".shape", "shape=(1,)", "def inner(shape):\n            return shape"):
        assert migrated.count(lookalike) == source.count(lookalike)
    assert f"super().{row.new}(" in migrated and f"super().{row.old}(" not in migrated
    assert f"other.{row.old}()" in migrated  # an untied receiver stays
    assert (f"runner.{row.new}(" in migrated) is (receiver == "tied")
    again, again_edits = _migrate(migrated)
    assert again == migrated and again_edits == {}
    assert edits["CG201"] == 2 + (receiver == "tied")  # the definition, the super call, a tied call
