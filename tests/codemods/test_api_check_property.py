"""Property: the migration rewrites a legacy class only where the new API accepts every use of it, and otherwise
leaves the code as written with a TODO at each refused place.

Subclasses and call sites of SGLang's ``CudaGraphRunner`` are generated from pools of members, overrides and
arguments, some of which the new ``DecodeCudaGraphRunner`` has or accepts and some not. The verdict expected is
computed from the exports manifest (members, signatures) with the signature rules, which ``test_signatures.py``
checks against Python's own binding; the migrated text is read back with :mod:`ast`.
"""

from __future__ import annotations

import ast

from hypothesis import given, settings
from hypothesis import strategies as st

from cudagraph.migrate.exports import ClassApi, load_exports
from cudagraph.migrate.renames import load_renames
from cudagraph.migrate.rules import select_rules
from cudagraph.migrate.signatures import Param, ParamKind, Signature
from cudagraph.migrate.source_migration import migrate_source

LEGACY = "sglang.srt.model_executor.cuda_graph_runner"
NEW = load_exports().api("cudagraph.runner.DecodeCudaGraphRunner")
assert isinstance(NEW, ClassApi)
READS = ["model_runner", "buckets", "config", "max_size", "graphs", "capture_bs", "output_buffers"]
"""Members a subclass reads: the first four the new runner has, the last three only the legacy one."""
OVERRIDE_PARAMS = ["bs", "forward", "stream_idx"]
KEYWORDS = ["config", "backend", "show_progress", "attn_backend"]
"""Constructor keywords: the first three the new runner takes, ``attn_backend`` only the legacy one."""
TODO = "# TODO(cudagraph-migrate):"


@st.composite
def plugins(draw: st.DrawFn) -> tuple[str, bool]:
    """A plugin module and whether the new API accepts all of it."""
    reads = draw(st.lists(st.sampled_from(READS), unique=True, max_size=3))
    override = draw(st.none() | st.lists(st.sampled_from(OVERRIDE_PARAMS), unique=True, min_size=0, max_size=3))
    positional = draw(st.integers(min_value=0, max_value=3))
    keywords = draw(st.lists(st.sampled_from(KEYWORDS), unique=True, max_size=2))
    body = "        return " + (" or ".join(f"self.{name}" for name in reads) or "None")
    lines = [f"from {LEGACY} import CudaGraphRunner", "", "", "class Plugin(CudaGraphRunner):", "    def peek(self):"]
    lines.append(body)
    accepted = all(NEW.has_member(name) for name in reads)
    if override is not None:
        params = ", ".join(["self", *override])
        lines += ["", f"    def capture_one_batch_size({params}):", "        return None"]
        signature = Signature(tuple(Param(name, ParamKind.POSITIONAL_OR_KEYWORD, True) for name in ["self", *override]))
        hook = NEW.method("capture_bucket")
        assert hook is not None
        accepted = accepted and signature.override_problem(hook) is None
    arguments = ", ".join([*(f"a{index}" for index in range(positional)), *(f"{name}=None" for name in keywords)])
    lines += ["", "", "def build(a0, a1, a2):", f"    return CudaGraphRunner({arguments})", ""]
    init = NEW.method("__init__")
    assert init is not None
    accepted = accepted and init.without_first().bind_problem(positional, keywords) is None
    return "\n".join(lines), accepted


@settings(max_examples=60, deadline=None)
@given(plugins())
def test_a_legacy_class_moves_only_where_the_new_api_accepts_every_use(plugin: tuple[str, bool]) -> None:
    source, accepted = plugin
    result = migrate_source(source, "plugin.py", select_rules([]), load_renames())
    migrated = result.migrated.decode()
    tree = ast.parse(migrated)
    modules = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    if accepted:
        assert modules == {"cudagraph.runner"}, migrated
        assert TODO not in migrated
        assert "class Plugin(DecodeCudaGraphRunner)" in migrated and "DecodeCudaGraphRunner(" in migrated
    else:
        assert modules == {LEGACY}, migrated  # nothing half-moved: every use stays on the legacy name
        code = [line for line in migrated.splitlines() if not line.strip().startswith("#")]
        assert not any("DecodeCudaGraphRunner" in line for line in code), migrated
        assert migrated.count(TODO) >= 2, migrated  # the import and at least one refused use
        assert "class Plugin(CudaGraphRunner)" in migrated and "    return CudaGraphRunner(" in migrated
    again = migrate_source(migrated, "plugin.py", select_rules([]), load_renames())
    assert again.migrated == result.migrated
