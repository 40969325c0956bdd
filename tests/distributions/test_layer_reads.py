"""No layer reaches up by reading: the backend packages never read an attribute named after a member of a runner or
engine class (``runner.static_buckets``, ``getattr(runner, "model_runner")``), even without importing them.

Imports are checked in ``test_workspace``; this checks what duck-typing would get past it. Read from the sources
with ``ast``, nothing imported, so it runs without torch. The higher layer's members are the methods, class fields
and ``self.`` attributes of every class in ``cudagraph.runner`` and of the engine's ``ModelRunner`` (what a runner
is built with), less the names the lower packages define themselves and a few generic names that torch objects and
compiled kernels carry too.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pytest

from .workspace import ROOT, load_distributions

DISTRIBUTIONS = load_distributions()

LOWER = ("cudagraph-backend", "cudagraph-backend-utils")
"""The packages that graph what they are given and must not know who gives it."""

OWN = (*LOWER, "cudagraph-config")
"""The packages whose own member names a lower package may read (a shared word is not a reach up)."""

ENGINE_CLASSES = {ROOT / "packages/cudagraph-engine/src/cudagraph/engine/model_runner.py": ("ModelRunner",)}
"""Engine classes a runner hands around (every class of ``cudagraph.runner`` counts as well)."""

GENERIC = {
    "dtype": "a tensor's",
    "size": "a tensor's",
    "run": "an FX interpreter's and a compiled kernel's",
    "clear": "a dict's and a list's",
}
"""Member names of a higher class that torch objects have too, with whose: reading them is not a reach up."""


def _is_self(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id in ("self", "cls")


def _class_members(cls: ast.ClassDef) -> Iterator[str]:
    for node in ast.walk(cls):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            yield node.target.id
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _is_self(node.value):
            yield node.attr


def members(paths: Iterable[Path], classes: tuple[str, ...] | None = None) -> set[str]:
    """Member names of the classes in ``paths`` (only those named ``classes``, when given)."""
    found: set[str] = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and (classes is None or node.name in classes):
                found.update(_class_members(node))
    return found


def higher_members() -> set[str]:
    """Member names only a runner or engine class has (see the module docstring)."""
    runner = members(DISTRIBUTIONS["cudagraph-runner"].source.rglob("*.py"))
    engine = set().union(*(members([path], classes) for path, classes in ENGINE_CLASSES.items()))
    own = members(path for name in OWN for path in DISTRIBUTIONS[name].source.rglob("*.py"))
    dunders = {name for name in runner | engine if name.startswith("__")}  # every object's protocol, not a layer's
    return (runner | engine) - own - dunders - GENERIC.keys()


def attribute_reads(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """``(line, name)`` of every attribute read of an object other than ``self`` or ``cls``: ``x.name``, and
    ``getattr(x, "name")`` or ``hasattr(x, "name")`` (duck-typing by string)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and not _is_self(node.value):
            yield node.lineno, node.attr
        elif _is_getattr(node) and isinstance(node.args[1].value, str):  # type: ignore[attr-defined]
            yield node.lineno, node.args[1].value  # type: ignore[attr-defined]


def _is_getattr(node: ast.AST) -> bool:
    """``getattr(x, "<constant>", ...)`` or ``hasattr(x, "<constant>")``."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("getattr", "hasattr")
        and len(node.args) >= 2
        and isinstance(node.args[1], ast.Constant)
    )


def reaches_up(source: str, higher: set[str]) -> list[str]:
    """``line: name`` of each read in ``source`` named after a member of a higher layer."""
    return [f"{line}: {name}" for line, name in attribute_reads(ast.parse(source)) if name in higher]


def test_the_higher_members_are_the_runner_and_engine_words() -> None:
    higher = higher_members()
    assert {"model_runner", "static_buckets", "shape_descriptor", "input_views", "captured_buckets"} <= higher
    # Words the backends own as well are theirs to read (tc_piecewise keeps its compiled ``model_forward``,
    # the forward context its ``attn_backend``).
    assert not {"options", "device", "phase", "backend", "replay", "model_forward", "attn_backend"} & higher


def problems_in(distribution: str, check: Callable[[Path, str], list[str]]) -> list[str]:
    """``path:line: what`` of every problem ``check(path, source)`` finds in the sources of ``distribution``."""
    return [
        f"{path.relative_to(ROOT)}:{where}"
        for path in sorted(DISTRIBUTIONS[distribution].source.rglob("*.py"))
        for where in check(path, path.read_text())
    ]


@pytest.mark.parametrize("name", LOWER)
def test_the_backend_packages_read_no_member_of_a_runner_or_an_engine(name: str) -> None:
    higher = higher_members()
    problems = problems_in(name, lambda path, source: reaches_up(source, higher))
    assert problems == [], "take what the backend needs as arguments (prepare's EntryInputs) instead of reading it"


def test_a_backend_that_reads_its_runner_is_named() -> None:
    """What ``prepare`` did before it was given its arguments: every way of reading the runner is caught."""
    source = (
        "def prepare(self, runner):\n"
        "    describe = getattr(runner, 'shape_descriptor', None)\n"
        "    forward = runner.model_runner.captured_buckets\n"
        "    hasattr(runner, 'static_buckets')\n"
        "    self.options.debug\n"
    )
    assert sorted(reaches_up(source, higher_members())) == [
        "2: shape_descriptor",
        "3: captured_buckets",
        "3: model_runner",
        "4: static_buckets",
    ]


# -- the runner reads the engine only through its protocols ----------------------------------------------------------

RUNNER = "cudagraph-runner"
PROTOCOLS = ROOT / "packages/cudagraph-runner/src/cudagraph/runner/protocols.py"
ENGINE_OBJECTS = ("model_runner", "attn_backend")
"""The names under which the runner holds the engine's objects (a model runner and its attention backend)."""


def protocol_members() -> set[str]:
    """Every member the runner's engine protocols declare (``ModelRunnerLike``, ``AttentionBackendLike`` and the
    optional ones beside them)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(PROTOCOLS.read_text())):
        if isinstance(node, ast.ClassDef) and any(getattr(base, "id", "") == "Protocol" for base in node.bases):
            found.update(_class_members(node))
    return found


def _engine_object(node: ast.expr) -> bool:
    """``model_runner``, ``self.model_runner``, ``attn_backend``, ``x.attn_backend`` and so on."""
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
    return name in ENGINE_OBJECTS


def engine_reads(source: str, declared: set[str]) -> list[str]:
    """``line: what`` of each read in ``source`` that goes around the protocols: a member of an engine object that
    no protocol declares, or any ``getattr``/``hasattr`` by a constant string (duck-typing a member by name)."""
    problems = []
    for node in ast.walk(ast.parse(source)):
        if _is_getattr(node):
            problems.append(f"{node.lineno}: getattr of {node.args[1].value!r}")  # type: ignore[attr-defined]
        elif isinstance(node, ast.Attribute) and _engine_object(node.value) and node.attr not in declared:
            problems.append(f"{node.lineno}: {node.attr}")
    return problems


def test_the_runner_reads_the_engine_only_through_its_protocols() -> None:
    declared = protocol_members()
    assert {"forward", "attn_backend", "model_forward", "graph_read_tensors", "needs_seq_lens_cpu"} <= declared
    problems = problems_in(RUNNER, lambda path, source: engine_reads(source, declared))
    assert problems == [], "declare what the runner reads in cudagraph.runner.protocols and read it typed"


def test_a_runner_that_duck_types_the_engine_is_named() -> None:
    source = (
        "def prepare(self):\n"
        "    forward = getattr(self.model_runner, 'model_forward', None)\n"
        "    self.model_runner.token_to_kv_pool.k_buffer\n"
        "    self.model_runner.attn_backend.init_cuda_graph_state(1, 1)\n"
        "    hasattr(attn_backend, 'needs_seq_lens_cpu')\n"
    )
    assert sorted(engine_reads(source, protocol_members())) == [
        "2: getattr of 'model_forward'",
        "3: token_to_kv_pool",
        "5: getattr of 'needs_seq_lens_cpu'",
    ]


# -- no module of the runner reaches into another's classes ----------------------------------------------------------


def private_members(source: str) -> set[str]:
    """The private (``_name``, not dunder) members of the classes ``source`` defines."""
    return {
        name
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ClassDef)
        for name in _class_members(node)
        if name.startswith("_") and not name.startswith("__")
    }


def reaches_in(source: str, others: set[str]) -> list[str]:
    """``line: name`` of each read in ``source`` of a private member (one of ``others``) of an object other than
    ``self`` or ``cls``: what a module does to a class of another module through its back door."""
    return [f"{line}: {name}" for line, name in attribute_reads(ast.parse(source)) if name in others]


def test_no_runner_module_reaches_into_a_class_of_another() -> None:
    """The captured buckets, the capture loop, lazy capture and the lifecycle share what is captured through public
    methods (``StaticBuckets``): a module that calls another module's ``runner._release_bucket`` is caught."""
    privates = {path: private_members(path.read_text()) for path in DISTRIBUTIONS[RUNNER].source.rglob("*.py")}

    def others_of(path: Path) -> set[str]:
        return set().union(*(names for other, names in privates.items() if other != path)) - privates[path]

    problems = problems_in(RUNNER, lambda path, source: reaches_in(source, others_of(path)))
    assert problems == [], "call a public method of the class (or make the one you need public) instead"


def test_a_module_that_reaches_into_the_runner_is_named() -> None:
    """What ``lazy_capture`` did before the captured buckets were one object."""
    runner = "class Runner:\n    def _capture_timed(self, bucket): ...\n    def _release_bucket(self, bucket): ...\n"
    lazy = (
        "def capture(runner, bucket):\n"
        "    stats = runner._capture_timed(bucket)\n"
        "    runner._release_bucket(bucket)\n"
        "    runner._helper_of_this_module = 1\n"
        "    self._release_bucket(bucket)\n"
    )
    assert sorted(reaches_in(lazy, private_members(runner))) == ["2: _capture_timed", "3: _release_bucket"]
