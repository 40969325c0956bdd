"""The exports manifest the codemods trust matches the packages, and every name the table points at exists.

Beside each module's exports, the manifest holds the members and signatures of every public class and function
(checked one by one against the installed packages in ``test_api_manifest.py``); here, that it covers all of them,
that its file has both halves, and that real objects built on the CPU (the runners after capture, the engine's
model runner and what it holds) carry no attribute the manifest does not list.
"""

from __future__ import annotations

import enum
import importlib
import inspect
import json
import sys

import pytest

from cudagraph.migrate.exports import (
    MANIFEST_PATH,
    MODULE_SOURCES,
    ClassApi,
    FunctionApi,
    load_exports,
    main,
    scan_sources,
)
from cudagraph.migrate.renames import RenameKind, load_renames
from cudagraph.migrate.verify import unresolved_references

MANIFEST = load_exports()


@pytest.mark.parametrize("module", sorted(MODULE_SOURCES))
def test_the_manifest_is_what_the_installed_module_exports(module: str) -> None:
    imported = importlib.import_module(module)
    assert MANIFEST.modules[module] == frozenset(imported.__all__)
    missing = [name for name in imported.__all__ if not hasattr(imported, name)]
    assert missing == [], f"{module}.__all__ names what it does not define"


def test_the_manifest_file_is_current_with_the_sources() -> None:
    assert scan_sources() == {module: sorted(names) for module, names in MANIFEST.modules.items()}
    assert main(["--check"]) == 0


def test_every_target_of_the_rename_table_exists() -> None:
    table = load_renames()
    missing = [
        row.new for row in table.of_kind(RenameKind.SYMBOL) if not MANIFEST.exports(row.new_module, row.new_name)
    ]
    missing += [row.new for row in table.of_kind(RenameKind.MODULE) if not MANIFEST.has_module(row.new)]
    missing += [
        owner
        for row in table
        for owner in row.owners
        if not MANIFEST.exports(owner.rpartition(".")[0], owner.rpartition(".")[2])
    ]
    assert missing == []


def test_the_post_condition_sees_every_import_form() -> None:
    before = "x = 1\n"
    after = (
        "from cudagraph.runner import DecodeCudaGraphRunner, Nope\n"
        "import cudagraph.nothing\n"
        "import cudagraph.backend_utils as bu\n"
        "from cudagraph import runner, missing_module\n"
        "bu.freeze_gc(); bu.not_there(); runner.Gone; cudagraph.config.Absent\n"
    )
    spelled = [reference.spelled() for reference in unresolved_references(before, after, MANIFEST)]
    assert sorted(spelled) == [
        "cudagraph.backend_utils.not_there",
        "cudagraph.config.Absent",
        "cudagraph.missing_module",
        "cudagraph.nothing",
        "cudagraph.runner.Gone",
        "cudagraph.runner.Nope",
    ]
    # a reference the file already had is the user's, not the migration's
    assert unresolved_references(after, after, MANIFEST) == []


def test_the_manifest_file_holds_the_modules_and_their_api() -> None:
    raw = json.loads(MANIFEST_PATH.read_text(encoding="utf-8"))
    assert set(raw) == {"modules", "api"}
    assert {module: frozenset(names) for module, names in raw["modules"].items()} == dict(MANIFEST.modules)
    assert set(raw["api"]) == set(MANIFEST.apis)
    assert load_exports() is MANIFEST  # read once per process


@pytest.mark.parametrize("module", sorted(MODULE_SOURCES))
def test_every_public_class_and_function_has_its_api_in_the_manifest(module: str) -> None:
    pytest.importorskip("torch", reason="imports the torch packages: pip install torch (`nox -s tests` does)")
    imported = importlib.import_module(module)
    for name in imported.__all__:
        value = getattr(imported, name)
        api = MANIFEST.api(f"{module}.{name}")
        ours = getattr(value, "__module__", "").startswith("cudagraph.")
        if not ours:  # an alias of someone else's object (GraphPoolHandle = typing.Any): nothing of ours to check
            assert api is None, f"{module}.{name}"
        elif inspect.isclass(value):
            assert isinstance(api, ClassApi), f"{module}.{name}"
            assert api.qualified == f"{module}.{name}"
            missing = sorted(set(_python_methods(value)) - set(api.methods))
            assert missing == [], f"{module}.{name}: methods the manifest lacks: {missing}"
        elif inspect.isfunction(value):
            assert isinstance(api, FunctionApi), f"{module}.{name}"
            assert api.qualified == f"{module}.{name}"
        else:
            assert api is None, f"{module}.{name} is neither a class nor a function"


def _python_methods(cls: type) -> list[str]:
    """Methods (inherited too) written in Python in the cudagraph packages: the manifest must have each signature.

    Those from ``object``, builtins (an exception's ``__init__``) or ``enum`` are not; nothing in the packages can
    change how they are called. Of what ``@dataclass`` generates, only ``__init__`` counts (users call it).
    """
    found = []
    for name in dir(cls):
        raw = inspect.getattr_static(cls, name)
        function = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw
        if not inspect.isfunction(function) or not function.__module__.startswith("cudagraph."):
            continue
        written = function.__code__.co_filename == inspect.getfile(sys.modules[function.__module__])
        if name == "__init__" or written:
            found.append(name)
    return found


def test_an_unknown_name_has_no_api() -> None:
    assert MANIFEST.api("cudagraph.runner.NoSuchRunner") is None
    assert MANIFEST.api("sglang.srt.model_executor.cuda_graph_runner.CudaGraphRunner") is None


def _public_classes() -> dict[type, str]:
    """Each public class of the installed packages -> the qualified name the manifest files it under."""
    found: dict[type, str] = {}
    for module in MODULE_SOURCES:
        imported = importlib.import_module(module)
        for name in imported.__all__:
            value = getattr(imported, name)
            if inspect.isclass(value):
                found.setdefault(value, f"{module}.{name}")
    return found


def test_real_objects_have_only_members_the_manifest_lists() -> None:
    """The runners after capture on the CPU engine, the engine's model runner, and every public object they hold."""
    pytest.importorskip("torch", reason="imports the torch packages: pip install torch (`nox -s tests` does)")
    from cudagraph.backend.testing import CpuReplayBackend
    from cudagraph.config import Backend, CudaGraphConfig, PhaseConfig
    from cudagraph.engine import CacheConfig, ModelRunner
    from cudagraph.engine.model import model_config_from_preset, random_model
    from cudagraph.runner import DecodeCudaGraphRunner, PrefillCudaGraphRunner

    # The CPU engine tests/runner uses: random weights, a small KV cache, decode full and prefill breakable.
    config = CudaGraphConfig(
        decode=PhaseConfig(Backend.FULL, (1, 2, 4), 4), prefill=PhaseConfig(Backend.BREAKABLE, (16, 32), 32)
    )
    model = random_model(model_config_from_preset("tiny-qwen3-random"), seed=0, dtype="float32", device="cpu")
    model_runner = ModelRunner(model, config, cache_config=CacheConfig(8, max_context_len=64))
    decode = DecodeCudaGraphRunner(model_runner, config, backend=CpuReplayBackend(Backend.FULL), show_progress=False)
    prefill = PrefillCudaGraphRunner(
        model_runner, config, backend=CpuReplayBackend(Backend.BREAKABLE), show_progress=False
    )
    decode.capture()
    prefill.capture()  # capture assigns more state than construction does

    public = _public_classes()
    objects = [decode, prefill, model_runner]
    # Enum members (a runner's forward mode) carry the enum machinery's attributes, not the class's API.
    held = [value for holder in list(objects) for value in vars(holder).values()]
    objects += [value for value in held if type(value) in public and not isinstance(value, enum.Enum)]
    checked: set[str] = set()
    for instance in objects:
        qualified = public[type(instance)]
        api = MANIFEST.api(qualified)
        assert isinstance(api, ClassApi)
        unlisted = sorted(set(vars(instance)) - api.members)
        assert unlisted == [], f"{qualified} instances have attributes the manifest lacks: {unlisted}"
        checked.add(qualified)
    assert {
        "cudagraph.runner.DecodeCudaGraphRunner",
        "cudagraph.runner.PrefillCudaGraphRunner",
        "cudagraph.engine.ModelRunner",
    } <= checked
