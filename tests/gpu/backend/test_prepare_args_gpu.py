"""A backend is built with what it graphs: ``prepare(model_forward, entries)`` with a plain forward and hand-made
entries, no runner and no engine anywhere, compiles and captures exactly as under a runner; replays read the
static inputs the entries named and match the eager forward on new values."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from cudagraph.backend import EntryInputs, FullCudaGraphBackend, make_backend
from cudagraph.backend_utils import ShapeDescriptor, compiled_model_forward

pytestmark = pytest.mark.gpu

SHAPES = (2, 4, 8)


def model_forward(input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The traceable part of a toy step."""
    return torch.sin(input_ids.float()) * 2.0 + positions.float()


def step(input_ids: torch.Tensor, positions: torch.Tensor) -> Callable[[], torch.Tensor]:
    """A toy whole step on static inputs: the compiled forward where a backend set one, then host-model work."""

    def run() -> torch.Tensor:
        forward = compiled_model_forward() or model_forward
        return forward(input_ids, positions) + 1.0

    return run


def test_full_with_compiled_small_shapes_is_prepared_from_its_arguments_alone() -> None:
    backend = make_backend("decode", "full", "cuda", share_global_pool=False, compile_max_shape=4)
    assert isinstance(backend, FullCudaGraphBackend)
    device = torch.device("cuda")
    input_ids = torch.arange(8, device=device)
    positions = torch.arange(8, device=device) * 3
    entries = {
        n: EntryInputs(ShapeDescriptor.decode(n), (input_ids[:n], positions[:n]), step(input_ids[:n], positions[:n]))
        for n in SHAPES
    }
    try:
        backend.prepare(model_forward, entries)
        assert backend.compiled_forward is not None
        assert backend.compile_stats is not None and backend.compile_stats.compilations >= 1
        assert backend.descriptors == {n: ShapeDescriptor.decode(n) for n in SHAPES}
        with backend.capture_session():
            for n in sorted(SHAPES, reverse=True):
                backend.capture_one(n, entries[n].run_step)
        assert set(backend.entries) == {ShapeDescriptor.decode(n) for n in SHAPES} and backend.shapes == SHAPES
        input_ids.copy_(torch.arange(8, device=device).flip(0) * 5)  # new values in the entries' static inputs
        for n in SHAPES:
            replayed = backend.replay(n).clone()
            torch.testing.assert_close(replayed, model_forward(input_ids[:n], positions[:n]) + 1.0)
        assert backend.compile_stats.recompiles_at_replay == 0
    finally:
        backend.cleanup()


def test_a_compiling_backend_without_a_forward_says_what_it_needs() -> None:
    backend = make_backend("decode", "tc_piecewise", "cuda", share_global_pool=False)
    ids = torch.zeros(4, dtype=torch.int64, device="cuda")
    entries = {4: EntryInputs(ShapeDescriptor.decode(4), (ids, ids), step(ids, ids))}
    with pytest.raises(TypeError, match="tc_piecewise needs the forward to trace"):
        backend.prepare(None, entries)
    with pytest.raises(TypeError, match=r"an entry to trace it on; got .* entries \[\]"):
        backend.prepare(model_forward, {})
