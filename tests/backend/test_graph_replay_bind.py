"""The bound graph replay: the C++ call only where torch's Python ``CUDAGraph.replay`` would add nothing.

Runs on the CPU: torch's Python source is read as installed, and the graphs are stand-ins whose C++ base is a
recording class put in place of ``torch._C._CUDAGraph``, so no device is needed to see which callable is bound.
"""

from __future__ import annotations

import importlib.util
import inspect
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from cudagraph.backend_utils import graph_replay_fn
from cudagraph.backend_utils.replay import (
    CHECKED_REPLAY_SOURCES,
    CHECKED_REPLAY_TORCH_VERSIONS,
    native_replay_refusal,
)


def test_installed_torch_replays_with_the_body_the_bind_was_checked_against() -> None:
    """Fails on a torch whose ``CUDAGraph.replay`` changed: read the new body, decide whether the C++ call still
    stands in for it (with no tracker and no hooks), then add it to ``CHECKED_REPLAY_SOURCES`` with its version."""
    replay = torch.cuda.CUDAGraph.replay
    if replay is getattr(torch._C._CUDAGraph, "replay", None):
        return  # this torch runs the C++ replay directly: the bind is exactly it
    installed = textwrap.dedent(inspect.getsource(replay))
    assert installed in CHECKED_REPLAY_SOURCES, (
        f"torch {torch.__version__}: CUDAGraph.replay is not the body the bind was checked against "
        f"(torch {', '.join(CHECKED_REPLAY_TORCH_VERSIONS)}), so every graph falls back to the public replay.\n"
        f"installed:\n{installed}"
    )


class _NativeGraph:
    """Stands in for ``torch._C._CUDAGraph``: its ``replay`` is what the bind calls, and it counts calls."""

    def __init__(self) -> None:
        self._tracker: object | None = None
        self.native_replays = 0

    def replay(self) -> None:
        self.native_replays += 1


@pytest.fixture(params=CHECKED_REPLAY_SOURCES, ids=["with-tracker-check", "plain"])
def graph_class(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[type[_NativeGraph]]:
    """A graph class over the recording C++ stand-in whose Python ``replay`` has exactly one of the checked bodies
    (defined in a real file, so ``inspect`` reads its source as it reads torch's)."""
    monkeypatch.setattr(torch._C, "_CUDAGraph", _NativeGraph)
    module_path = tmp_path / "checked_graph.py"
    module_path.write_text("class CheckedGraph(_NativeGraph):\n" + textwrap.indent(request.param, "    "))
    spec = importlib.util.spec_from_file_location("checked_graph", module_path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    module._NativeGraph = _NativeGraph  # type: ignore[attr-defined]
    spec.loader.exec_module(module)
    yield module.CheckedGraph


def test_a_graph_with_nothing_to_add_is_bound_to_the_cpp_replay(graph_class: type[_NativeGraph]) -> None:
    graph = graph_class()
    assert native_replay_refusal(graph) is None  # type: ignore[arg-type]
    replay = graph_replay_fn(graph)  # type: ignore[arg-type]
    assert replay != graph.replay
    replay()
    replay()
    assert graph.native_replays == 2


@pytest.mark.parametrize(
    ("attribute", "value", "reason"),
    [
        ("_tracker", object(), "liveness"),
        ("_replay_start_hooks", {1: print}, "replay hooks"),
        ("_replay_end_hooks", {1: print}, "replay hooks"),
        ("_has_graph_exec", False, "instantiated on its first replay"),
    ],
)
def test_a_graph_whose_python_replay_does_more_keeps_the_public_replay(
    graph_class: type[_NativeGraph], attribute: str, value: object, reason: str
) -> None:
    graph = graph_class()
    setattr(graph, attribute, value)
    refusal = native_replay_refusal(graph)  # type: ignore[arg-type]
    assert refusal is not None and reason in refusal
    assert graph_replay_fn(graph) == graph.replay  # type: ignore[arg-type]


def test_empty_hook_tables_and_an_instantiated_graph_are_still_bound(graph_class: type[_NativeGraph]) -> None:
    graph = graph_class()
    graph._replay_start_hooks = {}  # type: ignore[attr-defined]
    graph._replay_end_hooks = {}  # type: ignore[attr-defined]
    graph._has_graph_exec = True  # type: ignore[attr-defined]
    assert native_replay_refusal(graph) is None  # type: ignore[arg-type]


def test_another_replay_body_keeps_the_public_replay_and_names_the_torch_version(
    graph_class: type[_NativeGraph],
) -> None:
    class HookedGraph(graph_class):  # type: ignore[valid-type,misc]
        def replay(self) -> None:
            print("a new step before the launch")
            super().replay()

    graph = HookedGraph()
    refusal = native_replay_refusal(graph)
    assert refusal is not None and f"torch {torch.__version__}" in refusal
    assert graph_replay_fn(graph) == graph.replay


def test_a_graph_that_is_not_a_torch_graph_is_never_bound(graph_class: type[_NativeGraph]) -> None:
    class Unrelated:
        def replay(self) -> None:
            raise AssertionError("not called here")

    graph = Unrelated()
    assert native_replay_refusal(graph) == "it is not a torch C++ graph"  # type: ignore[arg-type]
    assert graph_replay_fn(graph) == graph.replay  # type: ignore[arg-type]


def test_a_torch_without_a_cpp_replay_is_never_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    class NoReplay:
        pass

    monkeypatch.setattr(torch._C, "_CUDAGraph", NoReplay)
    graph = NoReplay()
    assert native_replay_refusal(graph) == "it is not a torch C++ graph"  # type: ignore[arg-type]
