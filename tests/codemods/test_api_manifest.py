"""The API half of the exports manifest (members and signatures, read statically from the sources) against the
installed packages: what the codemods check rewrites against must be what users' code will meet at run time."""

from __future__ import annotations

import importlib
import inspect

import pytest

from cudagraph.migrate.exports import MANIFEST_PATH, ClassApi, FunctionApi, load_exports, manifest_text
from cudagraph.migrate.signatures import Param, ParamKind, Signature

MANIFEST = load_exports()
ENTRIES = sorted(MANIFEST.apis.items())


def _import(qualified: str) -> object:
    module, _, name = qualified.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _live_method(cls: type, name: str) -> Signature | None:
    raw = inspect.getattr_static(cls, name)
    if isinstance(raw, staticmethod):
        inner = Signature.from_inspect(inspect.signature(raw.__func__))
        return Signature((Param("self", ParamKind.POSITIONAL_OR_KEYWORD, True), *inner.params))
    if isinstance(raw, classmethod):
        return Signature.from_inspect(inspect.signature(raw.__func__))
    if inspect.isfunction(raw):
        return Signature.from_inspect(inspect.signature(raw))
    return None


def test_the_manifest_is_up_to_date_with_the_sources() -> None:
    assert MANIFEST_PATH.read_text(encoding="utf-8") == manifest_text(), (
        "run python -m cudagraph.migrate.exports --write"
    )


def test_every_public_class_and_function_of_the_runner_is_covered() -> None:
    for name in (
        "DecodeCudaGraphRunner",
        "PrefillCudaGraphRunner",
        "BaseCudaGraphRunner",
        "get_batch_sizes_to_capture",
    ):
        assert f"cudagraph.runner.{name}" in MANIFEST.apis


@pytest.mark.parametrize(("qualified", "api"), ENTRIES, ids=[qualified for qualified, _ in ENTRIES])
def test_signatures_and_members_match_the_installed_packages(qualified: str, api: ClassApi | FunctionApi) -> None:
    pytest.importorskip("torch", reason="imports the torch packages: pip install torch (`nox -s tests` does)")
    live = _import(qualified)
    if isinstance(api, FunctionApi):
        assert Signature.from_inspect(inspect.signature(live)) == api.signature
        return
    assert isinstance(live, type)
    for name, signature in api.methods.items():
        if name == "__init__" and inspect.getattr_static(live, "__init__", None) is object.__init__:
            continue
        assert _live_method(live, name) == signature, name
    public = {name for name in dir(live) if not name.startswith("__")} - set(dir(object))
    if not api.open:
        assert public <= api.members, sorted(public - api.members)


def test_a_runner_instance_has_only_members_the_manifest_lists() -> None:
    torch = pytest.importorskip("torch", reason="imports the torch packages: pip install torch (`nox -s tests` does)")
    from cudagraph.backend.testing import CpuReplayBackend
    from cudagraph.config import resolve
    from cudagraph.runner import DecodeCudaGraphRunner

    config = resolve(decode_cuda_graph_bs=[1, 2], decode_cuda_graph_max_bs=2)

    class Attention:
        def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
            pass

        def get_cuda_graph_seq_len_fill_value(self) -> int:
            return 1

        def init_forward_metadata_capture_cuda_graph(self, *args: object, **kwargs: object) -> None:
            pass

        def init_forward_metadata_replay_cuda_graph(self, *args: object, **kwargs: object) -> None:
            pass

    class ModelRunner:
        device = "cpu"
        dtype = torch.float32
        attn_backend = Attention()

    try:
        runner = DecodeCudaGraphRunner(ModelRunner(), config, backend=CpuReplayBackend(), show_progress=False)
    except (AttributeError, TypeError) as error:  # the stand-in lacks something the runner reads
        pytest.fail(f"the stand-in model runner is incomplete: {error}")
    api = MANIFEST.api("cudagraph.runner.DecodeCudaGraphRunner")
    assert isinstance(api, ClassApi)
    assert set(vars(runner)) <= api.members, sorted(set(vars(runner)) - api.members)


@pytest.mark.realtrees
def test_the_legacy_api_data_is_what_sglang_0_5_13_says(capsys: pytest.CaptureFixture[str]) -> None:
    from realtrees.trees import TREES

    from cudagraph.migrate import legacy_api

    (tree,) = [tree for tree in TREES if tree.name == "sglang-0.5.13"]
    if not tree.ready():
        pytest.skip(tree.unavailable_reason())
    assert legacy_api.main(["--sglang", str(tree.path() / "sglang"), "--check"]) == 0, capsys.readouterr().err
    data = legacy_api.load_legacy_api()
    runner = data.classes["sglang.srt.model_executor.cuda_graph_runner.CudaGraphRunner"]
    assert {"capture_one_batch_size", "_create_device_graph", "graphs"} <= runner.members
