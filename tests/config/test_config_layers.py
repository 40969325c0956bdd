"""The config package's own layers: the vocabulary under everything, the resolved config under the flags."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import cudagraph.config

CONFIG_SOURCE = Path(cudagraph.config.__file__).parent


def _imports(module: str, *, type_checking: bool = True) -> set[str]:
    """Module names ``module`` imports, relative ones spelled ``.name``; those under ``if TYPE_CHECKING:`` only when
    ``type_checking``."""
    tree = ast.parse((CONFIG_SOURCE / f"{module}.py").read_text())
    skipped: set[int] = set()
    if not type_checking:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
                skipped.update(id(child) for child in ast.walk(node))
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.add("." * node.level + (node.module or ""))
    return found


def test_the_vocabulary_imports_the_standard_library_only() -> None:
    imported = _imports("vocabulary")
    assert "collections.abc" in imported  # the parse sees its imports
    outside = sorted(name for name in imported if name.split(".")[0] not in sys.stdlib_module_names | {"__future__"})
    assert outside == []


def test_the_resolved_config_sits_under_the_flag_table() -> None:
    """``types`` renders no flags itself and never imports the flag table; ``cli_args``, which writes a config back
    as flags, imports the config type for its annotation only."""
    assert ".flags" not in _imports("types")
    assert ".vocabulary" in _imports("types")
    assert ".types" not in _imports("cli_args", type_checking=False)
    assert ".flags" not in _imports("cli_args")


def test_option_names_are_defined_once() -> None:
    """The flag table reads its option names from the vocabulary instead of spelling them again."""
    from cudagraph.config import flags, vocabulary

    assert flags.BUCKETS_OPTIONS is vocabulary.BUCKETS_OPTIONS
    assert flags.SWITCH_OPTIONS is vocabulary.SWITCH_OPTIONS
    assert '"--decode-cuda-graph-bs"' not in (CONFIG_SOURCE / "flags.py").read_text()  # as a string literal
