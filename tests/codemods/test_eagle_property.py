"""Property: an EAGLE fork's subclass of SGLang's draft runners moves onto cudagraph's draft runner only where the
new runner accepts all of it, and otherwise stays, with a TODO saying what the new runner does instead of each hook
it overrides.

Subclasses of ``EAGLEDraftCudaGraphRunner`` / ``EAGLEDraftExtendCudaGraphRunner`` (in a file on the retired legacy
runner, so the names are legacy) are drawn from pools of overrides: methods the new runner keeps (``can_run``,
``capture``), hooks it has not or whose result changed (the symbol row's ``hooks``), and a constructor calling
``super().__init__(eagle_worker)`` or not. The verdict expected is computed from the rename table and the exports
manifest alone; the migrated text is read back with :mod:`ast`.
"""

from __future__ import annotations

import ast

from hypothesis import given, settings
from hypothesis import strategies as st

from cudagraph.migrate.exports import ClassApi, load_exports
from cudagraph.migrate.renames import load_renames
from cudagraph.migrate.rules import select_rules
from cudagraph.migrate.source_migration import migrate_source

TABLE = load_renames()
RUNNERS = {
    "EAGLEDraftCudaGraphRunner": "sglang.srt.speculative.eagle_draft_cuda_graph_runner",
    "EAGLEDraftExtendCudaGraphRunner": "sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner",
}
KEPT_METHODS = {"can_run": "forward_batch", "capture": None}
"""Methods both runners have with the same meaning: an override that calls its super moves."""
TODO = "# TODO(cudagraph-migrate):"


@st.composite
def fork_files(draw: st.DrawFn) -> tuple[str, str, str, list[str]]:
    """A fork's file: its source, the legacy class, its new class, and the advice each refused override must carry
    (empty: the class moves)."""
    legacy = draw(st.sampled_from(sorted(RUNNERS)))
    row = TABLE.symbol(RUNNERS[legacy], legacy)
    assert row is not None and row.hooks
    hooks = dict(row.hooks)
    kept = draw(st.lists(st.sampled_from(sorted(KEPT_METHODS)), unique=True, max_size=2))
    overridden = draw(st.lists(st.sampled_from(sorted(hooks)), unique=True, max_size=2))
    with_init = draw(st.booleans())
    lines = [
        "from sglang.srt.model_executor.cuda_graph_runner import freeze_gc",
        f"from {RUNNERS[legacy]} import {legacy}",
        "",
        "",
        f"class ForkRunner({legacy}):",
        "    calls = 0",
    ]
    if with_init:
        lines += ["", "    def __init__(self, eagle_worker):", "        super().__init__(eagle_worker)"]
    for name in kept:
        parameter = KEPT_METHODS[name]
        params, args = (f"self, {parameter}", parameter) if parameter else ("self", "")
        lines += ["", f"    def {name}({params}):", "        self.calls += 1", f"        return super().{name}({args})"]
    for name in overridden:
        lines += ["", f"    def {name}(self, *args, **kwargs):", "        return None"]
    lines += ["", "", "def gc_off():", "    return freeze_gc(False)", ""]
    advice = [hooks[name] for name in overridden] + (["'config'"] if with_init else [])
    return "\n".join(lines), legacy, row.new_name, advice


@settings(max_examples=50, deadline=None)
@given(fork_files())
def test_an_eagle_subclass_moves_only_where_the_draft_runner_accepts_all_of_it(
    case: tuple[str, str, str, list[str]],
) -> None:
    source, legacy, new, advice = case
    assert isinstance(load_exports().api(f"cudagraph.runner.{new}"), ClassApi)
    result = migrate_source(source, "fork/runner.py", select_rules([]), TABLE)
    migrated = result.migrated.decode()
    tree = ast.parse(migrated)
    (fork,) = [node for node in tree.body if isinstance(node, ast.ClassDef)]
    imported = {
        alias.name: node.module for node in tree.body if isinstance(node, ast.ImportFrom) for alias in node.names
    }
    assert imported["freeze_gc"] == "cudagraph.backend_utils"  # the helper moves either way
    if not advice:
        assert [ast.unparse(base) for base in fork.bases] == [new], migrated
        assert imported[new] == "cudagraph.runner" and legacy not in imported
        assert TODO not in migrated
    else:
        assert [ast.unparse(base) for base in fork.bases] == [legacy], migrated
        assert imported[legacy] == RUNNERS[legacy] and new not in imported
        todos = " ".join(line.strip().removeprefix("#").strip() for line in migrated.splitlines() if "#" in line)
        for text in advice:  # each refused override says what the new runner does instead (wrapped words joined)
            assert " ".join(text.split()) in todos, text
    again = migrate_source(migrated, "fork/runner.py", select_rules([]), TABLE)
    assert again.migrated == result.migrated
