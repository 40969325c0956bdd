"""The examples in the docstrings of every ``cudagraph.config`` module run as written."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import cudagraph.config

MODULES = [
    *sorted(f"cudagraph.config.{module.name}" for module in pkgutil.iter_modules(cudagraph.config.__path__)),
    "cudagraph.config",
]


@pytest.mark.parametrize("name", [name for name in MODULES if not name.endswith("__main__")])
def test_docstring_examples(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0


def test_the_modules_that_explain_the_grid_have_examples() -> None:
    finder = doctest.DocTestFinder()
    for name in ("cudagraph.config.grid", "cudagraph.config.phase_config", "cudagraph.config.memory_budget"):
        assert any(test.examples for test in finder.find(importlib.import_module(name))), name
