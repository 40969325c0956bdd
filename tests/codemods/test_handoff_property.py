"""Property: a legacy class or function used as a value, a dotted string naming one, and an import in a fallback
branch are rewritten only where the new API can be used the same way; everywhere else the code stays as written with
a ``# TODO(cudagraph-migrate)`` comment above it.

The oracle is independent of the codemods: the construction contract is bound with :mod:`inspect` (the legacy
signature's required positional parameters, from the legacy API data, passed to the new signature from the exports
manifest, each landing on a parameter of the same meaning), and what the migrated file binds is read with :mod:`ast`.
"""

from __future__ import annotations

import ast
import inspect

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cudagraph.migrate.exports import ClassApi, load_exports
from cudagraph.migrate.legacy_api import load_legacy_api
from cudagraph.migrate.options import RunOptions
from cudagraph.migrate.renames import Rename, RenameKind, load_renames
from cudagraph.migrate.rules import RULES
from cudagraph.migrate.signatures import ParamKind, Signature
from cudagraph.migrate.source_migration import migrate_source
from cudagraph.migrate.todo_comments import TODO_MARKER

TABLE = load_renames()
EXPORTS = load_exports()
LEGACY = load_legacy_api()
PATH = "plugin/hooks.py"

SUBJECTS: tuple[Rename, ...] = tuple(
    row
    for row in TABLE.of_kind(RenameKind.SYMBOL)
    if not row.shared_state  # state shared with the engine's runner stays for its own reason (shared_state_stays)
    and (row.old.startswith("sglang.") or row.old_module == "cudagraph.legacy.cuda_graph_runner")
    and (EXPORTS.api(row.new) is not None)
)
"""Legacy classes and functions of SGLang and of the shims, each with the name it becomes."""

VALUE_USES = {
    "return": "    return {name}\n",
    "assign": "    chosen = {name}\n    return chosen\n",
    "dict": '    return {{"decode": {name}}}\n',
    "list": "    return [{name}, None]\n",
    "argument": "    return registry.add({name})\n",
}
PATCH_USES = {
    "store": "    {name}.hooked = registry\n",
    "setattr": '    setattr({name}, "hooked", registry)\n',
    "hasattr": '    return hasattr({name}, "replay")\n',
}
TYPE_USES = {
    "isinstance": "    return isinstance(registry, {name})\n",
    "annotation": "    chosen: {name} = registry\n    return chosen\n",
    "truth": "    return {name} is not None\n",
}
USES = {**VALUE_USES, **PATCH_USES, **TYPE_USES}
FALLBACKS = ("none", "try_other_module", "try_none", "if_else")


def _inspect_signature(signature: Signature) -> inspect.Signature:
    kinds = {
        ParamKind.POSITIONAL_ONLY: inspect.Parameter.POSITIONAL_ONLY,
        ParamKind.POSITIONAL_OR_KEYWORD: inspect.Parameter.POSITIONAL_OR_KEYWORD,
        ParamKind.VAR_POSITIONAL: inspect.Parameter.VAR_POSITIONAL,
        ParamKind.KEYWORD_ONLY: inspect.Parameter.KEYWORD_ONLY,
        ParamKind.VAR_KEYWORD: inspect.Parameter.VAR_KEYWORD,
    }
    return inspect.Signature(
        [
            inspect.Parameter(
                param.name,
                kinds[param.kind],
                default=inspect.Parameter.empty if param.required else None,
            )
            for param in signature.params
        ]
    )


def contract_holds(row: Rename) -> bool:
    """Whether the legacy engine's call of ``row.old`` (its required positional parameters, positionally) binds to
    ``row.new`` with every argument landing on a parameter that means the same."""
    if row.old.startswith("cudagraph."):
        return True  # the shims' objects are the new ones
    new_api = EXPORTS.api(row.new)
    legacy = LEGACY.constructor(row.old)
    if legacy is None:
        return not isinstance(new_api, ClassApi)
    if isinstance(new_api, ClassApi):
        init = new_api.method("__init__")
        assert init is not None
        new_signature = init.without_first()
    else:
        assert new_api is not None
        new_signature = new_api.signature
    passed = [
        param.name
        for param in legacy.params
        if param.required and param.kind in (ParamKind.POSITIONAL_ONLY, ParamKind.POSITIONAL_OR_KEYWORD)
    ]
    try:
        bound = _inspect_signature(new_signature).bind(*passed)
    except TypeError:
        return False
    same_meaning = dict(row.parameters)
    return all(
        isinstance(value, str) and same_meaning.get(value, value) == parameter
        for parameter, value in bound.arguments.items()
    )


def _imports(row: Rename, fallback: str) -> str:
    legacy_import = f"from {row.old_module} import {row.old_name}"
    if fallback == "none":
        return legacy_import + "\n"
    if fallback == "try_other_module":
        other = f"from plugin_runtime.runners import Runner as {row.old_name}"
        return f"try:\n    {other}\nexcept ImportError:\n    {legacy_import}\n"
    if fallback == "try_none":
        return f"try:\n    {legacy_import}\nexcept ImportError:\n    {row.old_name} = None\n"
    return f"import sys\n\nif sys.version_info >= (3, 11):\n    {legacy_import}\nelse:\n    {row.old_name} = None\n"


def _migrate(text: str) -> str:
    return migrate_source(text, PATH, RULES, TABLE, RunOptions()).migrated.decode()


def _marked_above(output: str, statement: str) -> bool:
    """Whether the first line of ``statement`` in ``output`` has a TODO comment in the comments just above it."""
    lines = output.splitlines()
    index = lines.index(statement.splitlines()[0])
    above = []
    while index > 0 and lines[index - 1].lstrip().startswith("#"):
        index -= 1
        above.append(lines[index].lstrip())
    return any(line.startswith(TODO_MARKER) for line in above)


def _imports_legacy(tree: ast.Module, row: Rename) -> bool:
    return any(
        isinstance(node, ast.ImportFrom)
        and node.module == row.old_module
        and any(alias.name == row.old_name for alias in node.names)
        for node in ast.walk(tree)
    )


def _binds(statements: list[ast.stmt], name: str) -> bool:
    for statement in statements:
        if isinstance(statement, ast.ImportFrom) and any(
            (alias.asname or alias.name) == name for alias in statement.names
        ):
            return True
        if isinstance(statement, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == name for target in statement.targets
        ):
            return True
    return False


def _every_branch_binds(tree: ast.Module, name: str) -> bool:
    for node in tree.body:
        if isinstance(node, ast.Try):
            branches = [node.body, *(handler.body for handler in node.handlers)]
        elif isinstance(node, ast.If):
            branches = [node.body, node.orelse]
        else:
            continue
        if not all(_binds(branch, name) for branch in branches):
            return False
    return True


RETIRED = "from sglang.srt.model_executor.cuda_graph_runner import freeze_gc as retired_freeze_gc\n"
"""An import of a retired legacy module: it puts a file on the legacy runner, where the modules SGLang still ships
(its EAGLE draft runners) are legacy too."""


def _still_shipped_and_current(row: Rename, retired_too: bool) -> bool:
    """Whether ``row``'s module is one SGLang still ships and the file uses no retired module: its current API."""
    return TABLE.modules[row.old_module].still_shipped and not retired_too


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(SUBJECTS), st.sampled_from(sorted(USES)), st.sampled_from(FALLBACKS), st.booleans())
def test_a_use_moves_only_where_the_new_name_can_be_used_the_same_way(
    row: Rename, use: str, fallback: str, retired_too: bool
) -> None:
    body = USES[use].format(name=row.old_name)
    imports = (RETIRED if retired_too else "") + _imports(row, fallback)
    source = f"{imports}\n\ndef hand_on(model_runner, config, registry):\n{body}"
    output = _migrate(source)
    if _still_shipped_and_current(row, retired_too):
        assert output == source
        return
    tree = ast.parse(output)
    shim = row.old.startswith("cudagraph.")
    if use in TYPE_USES or shim:
        moves = True
    elif use in PATCH_USES:
        moves = False
    else:
        moves = contract_holds(row)
    assert _every_branch_binds(tree, row.old_name), output
    if moves:
        assert not _imports_legacy(tree, row), output
        assert TODO_MARKER not in output, output
    else:
        assert _imports_legacy(tree, row), output
        assert _marked_above(output, body.splitlines()[0]), output
    assert _migrate(output) == output


STRING_FORMS = ("module", "module_fetched", "name", "member", "prefix")


def _string_source(row: Rename, form: str) -> tuple[str, str]:
    """A file using ``row`` through a dotted string, and the line holding that string."""
    if form in ("module", "module_fetched"):
        line = f'module = importlib.import_module("{row.old_module}")'
        fetch = f'runner = getattr(module, "{row.old_name}")\n' if form == "module_fetched" else ""
        return f"import importlib\n\n{line}\n{fetch}", line
    if form == "name":
        line = f'RUNNER = "{row.old}"'
        return f"{line}\n", line
    if form == "member":
        line = f'HOOKS = {{"{row.old}.replay": print}}'
        return f"{line}\n", line
    line = f'CLS = "{row.old}"'
    return f'{line}\nTARGETS = [f"{{CLS}}._capture_graph"]\n', line


def _string_moves(row: Rename, form: str) -> bool:
    shim = row.old.startswith("cudagraph.")
    if form == "module":
        return True
    if form == "module_fetched":
        module_row = TABLE.modules[row.old_module]
        same_name = EXPORTS.exports(module_row.new, row.old_name)
        return same_name and contract_holds(Rename(**{**row.__dict__, "new": f"{module_row.new}.{row.old_name}"}))
    if form == "name":
        return contract_holds(row)
    return shim  # a member path or a prefix of one: only the shims' (their classes are the new ones)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(SUBJECTS), st.sampled_from(STRING_FORMS), st.booleans())
def test_a_dotted_string_moves_only_where_it_names_a_module_or_a_name_used_the_same_way(
    row: Rename, form: str, retired_too: bool
) -> None:
    source, line = _string_source(row, form)
    source = (RETIRED if retired_too else "") + source
    output = _migrate(source)
    if _still_shipped_and_current(row, retired_too):
        assert output == source
        return
    if _string_moves(row, form):
        assert line not in output.splitlines(), output
        assert TODO_MARKER not in output, output
    else:
        assert line in output.splitlines(), output
        assert _marked_above(output, line), output
    assert _migrate(output) == output
