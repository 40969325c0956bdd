"""Without CUDA everything imports and the runtime says plainly that CUDA graphs need a CUDA device."""

from __future__ import annotations

import subprocess
import sys
import types

import pytest
import torch

import cudagraph.backend as backend_package
import cudagraph.backend_utils as utils_package
from cudagraph.backend import BreakableCudaGraphBackend, FullCudaGraphBackend, make_backend
from cudagraph.backend_utils import (
    BreakableCUDAGraph,
    CudaGraphsUnavailableError,
    DeviceMemoryProbe,
    GraphPool,
    breakable_capture,
    free_device_memory,
    get_global_graph_memory_pool,
    new_graph_pool,
    require_cuda,
    set_global_graph_memory_pool,
)

NO_CUDA_MESSAGE = "CUDA graphs need a CUDA device"


@pytest.fixture
def no_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pretend there is no CUDA, so these tests say the same on a GPU machine."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_packages_import_in_a_fresh_interpreter_without_cuda() -> None:
    code = (
        "import os, torch; os.environ['CUDA_VISIBLE_DEVICES'] = ''; "
        "import cudagraph.backend, cudagraph.backend_utils; "
        "print(cudagraph.backend.__version__, cudagraph.backend_utils.__version__)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={"CUDA_VISIBLE_DEVICES": ""}, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["0.1.0", "0.1.0"]


WITHOUT_TRITON = """
import sys
import types
sys.modules["triton"] = None  # not installed, whether or not this machine has it
import torch
import cudagraph.backend_utils as utils

launched = []


class Kernel:
    arg_names = ["x_ptr", "BLOCK"]

    def warmup(self, *args, **kwargs):
        raise AssertionError("compiled without Triton")

    def __getitem__(self, grid):
        return lambda *args, **kwargs: launched.append((grid, len(args), sorted(kwargs)))


x = torch.zeros(4)
launcher = utils.FastLauncher(Kernel())
launcher((1,), (x,), {"BLOCK": 4})
launcher.bind((2,), (x,), {"BLOCK": 4}, num_warps=2)()
print(launcher.jit_only, utils.direct_launch(Kernel(), (1,), (x,), {"BLOCK": 4}, 4), utils.cdiv(9, 4), launched)
"""


def test_without_triton_backend_utils_imports_and_launches_through_the_jit_call() -> None:
    result = subprocess.run([sys.executable, "-c", WITHOUT_TRITON], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    jit_calls = "[((1,), 1, ['BLOCK', 'num_warps']), ((2,), 1, ['BLOCK', 'num_warps'])]"
    assert result.stdout.strip() == f"True None 3 {jit_calls}"


def test_importing_backend_utils_does_not_import_triton() -> None:
    """Triton reads TRITON_INTERPRET once, when first imported: importing the layer must leave that to the user."""
    code = "import sys, cudagraph.backend_utils; print('triton' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


@pytest.mark.parametrize(
    "make",
    [
        lambda: make_backend("decode", "full", "cuda"),
        lambda: make_backend("prefill", "breakable"),
        lambda: FullCudaGraphBackend("cuda:0"),
        lambda: BreakableCudaGraphBackend(),
        lambda: BreakableCUDAGraph(),
        lambda: breakable_capture().__enter__(),
        lambda: new_graph_pool(),
        lambda: GraphPool.create(),
        lambda: GraphPool.shared("cuda"),
        lambda: free_device_memory(),
        lambda: DeviceMemoryProbe(),
        lambda: require_cuda(0),
    ],
    ids=[
        "make_backend-full",
        "make_backend-breakable",
        "FullCudaGraphBackend",
        "BreakableCudaGraphBackend",
        "BreakableCUDAGraph",
        "breakable_capture",
        "new_graph_pool",
        "GraphPool.create",
        "GraphPool.shared",
        "free_device_memory",
        "DeviceMemoryProbe",
        "require_cuda",
    ],
)
def test_runtime_entry_points_raise_one_clear_error(no_cuda: None, make) -> None:
    with pytest.raises(CudaGraphsUnavailableError, match=NO_CUDA_MESSAGE):
        make()


def test_a_cpu_device_is_rejected_even_with_cuda_present(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(CudaGraphsUnavailableError, match="got device cpu"):
        require_cuda("cpu")


@pytest.fixture
def no_global_pool() -> object:
    """Leave the process-wide pool as it was."""
    previous = get_global_graph_memory_pool()
    set_global_graph_memory_pool(None)
    yield
    set_global_graph_memory_pool(previous)


def test_global_pool_round_trips_a_legacy_handle(no_global_pool: None) -> None:
    handle = (0, 7)  # what torch.cuda.graph_pool_handle() returns; legacy code passes it around bare
    set_global_graph_memory_pool(handle)
    assert get_global_graph_memory_pool() is handle
    shared = GraphPool.shared()  # adopts the published handle: no device needed
    assert shared.handle is handle and shared.is_shared
    set_global_graph_memory_pool(None)
    assert get_global_graph_memory_pool() is None and not shared.is_shared


def test_each_shared_user_releases_only_itself(no_global_pool: None) -> None:
    creator = GraphPool.adopt((0, 1))
    set_global_graph_memory_pool(creator)
    user = GraphPool.shared()
    assert user is not creator and user.handle == creator.handle
    user.release()  # another user's cleanup leaves the pool published for the creator
    assert get_global_graph_memory_pool() == (0, 1)
    creator.release()  # the published object's release unpublishes it, so the next capture starts a new pool
    assert get_global_graph_memory_pool() is None


def test_setting_the_published_handle_again_keeps_the_published_pool(no_global_pool: None) -> None:
    creator = GraphPool.adopt((0, 2))
    set_global_graph_memory_pool(creator)
    set_global_graph_memory_pool((0, 2))
    creator.release()
    assert get_global_graph_memory_pool() is None


FIXED_NAMES = {
    utils_package: (
        *("is_capture_mode", "model_capture_mode", "freeze_gc"),
        *("get_global_graph_memory_pool", "set_global_graph_memory_pool"),
        *("is_in_tc_piecewise_cuda_graph", "enable_tc_piecewise_cuda_graph"),
        *("is_in_torch_compile_warmup", "enable_torch_compile_warmup", "is_in_breakable_cuda_graph"),
        *("ForwardContext", "set_forward_context", "get_forward_context"),
        *("BreakableCUDAGraph", "weak_ref_tensor", "add_eager", "eager_break", "register_break_op"),
        *("free_device_memory", "DeviceMemoryProbe", "CudaGraphsUnavailableError"),
    ),
    backend_package: (
        *("BaseCudaGraphBackend", "FullCudaGraphBackend", "BreakableCudaGraphBackend", "make_backend"),
        "TC_PIECEWISE_CUDA_GRAPH_CAPTURE_FAILED_MSG",
    ),
}
"""The names design.md fixes, by the package that exports them at its top level."""


@pytest.mark.parametrize(
    ("package", "name"),
    [(package, name) for package, names in FIXED_NAMES.items() for name in names],
    ids=lambda value: value if isinstance(value, str) else value.__name__,
)
def test_each_package_exports_its_fixed_names(package: types.ModuleType, name: str) -> None:
    assert name in package.__all__
    assert getattr(package, name).__doc__


def test_legacy_names_are_not_defined_here() -> None:
    for legacy in ("get_is_capture_mode", "is_in_piecewise_cuda_graph", "enable_piecewise_cuda_graph"):
        assert not hasattr(utils_package, legacy)
    assert not hasattr(backend_package, "PIECEWISE_CUDA_GRAPH_CAPTURE_FAILED_MSG")
