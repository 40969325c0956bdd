"""What a runner builds its backend with (``prepare``): the forward to trace and, per bucket, the shape descriptor and
the static inputs it captures with; a run of the step each entry carries is the runner's own forward on them."""

from __future__ import annotations

import pytest
import torch
from runner_helpers import make_model_runner

from cudagraph.backend import EntryInputs
from cudagraph.backend.testing import CpuReplayBackend
from cudagraph.backend_utils import ShapeDescriptor
from cudagraph.config import Backend
from cudagraph.runner import DecodeCudaGraphRunner, PrefillCudaGraphRunner


class RecordingBackend(CpuReplayBackend):
    """Keeps the entries ``prepare`` is given."""

    def prepare(self, model_forward, entries) -> None:
        super().prepare(model_forward, entries)
        self.given: dict[int, EntryInputs] = dict(entries)


@pytest.mark.parametrize("query_len", [1, 3])
def test_a_decode_runner_gives_each_bucket_its_descriptor_and_static_inputs(query_len: int) -> None:
    model_runner = make_model_runner()
    backend = RecordingBackend(Backend.FULL)
    runner = DecodeCudaGraphRunner(
        model_runner, model_runner.cuda_graph_config, backend=backend, show_progress=False, query_len=query_len
    )
    runner.capture()
    assert backend.prepared == 1 and backend.prepared_forward == model_runner.model_forward
    assert sorted(backend.given) == list(runner.buckets)
    for bucket, entry in backend.given.items():
        assert entry.descriptor == ShapeDescriptor.uniform(bucket, query_len) == backend.descriptors[bucket]
        batch = runner.static_buckets[bucket].batch
        assert entry.token_inputs[0] is batch.input_ids and entry.token_inputs[1] is batch.positions
        assert entry.tokens == bucket * query_len == entry.token_inputs[0].shape[0]
    # The backend keys what it captured by those descriptors.
    assert set(backend.entries) == {ShapeDescriptor.uniform(bucket, query_len) for bucket in runner.buckets}
    assert backend.shapes == runner.buckets and backend.entry(runner.max_size).shape == runner.max_size
    largest = backend.given[runner.max_size]
    torch.testing.assert_close(largest.run_step(), model_runner.forward(runner.static_buckets[runner.max_size].batch))


def test_a_prefill_runner_gives_token_descriptors() -> None:
    model_runner = make_model_runner()
    backend = RecordingBackend(Backend.BREAKABLE)
    runner = PrefillCudaGraphRunner(model_runner, model_runner.cuda_graph_config, backend=backend, show_progress=False)
    runner.capture()
    assert {bucket: entry.descriptor for bucket, entry in backend.given.items()} == {
        bucket: ShapeDescriptor.prefill(bucket) for bucket in runner.buckets
    }


def test_a_recapture_prepares_once() -> None:
    model_runner = make_model_runner()
    backend = RecordingBackend(Backend.FULL)
    runner = DecodeCudaGraphRunner(model_runner, model_runner.cuda_graph_config, backend=backend, show_progress=False)
    runner.capture()
    runner.shutdown()
    runner.capture()
    assert backend.prepared == 1
