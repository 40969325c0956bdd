"""Steps written straight into a runner's static buffers (``input_views``, decode and prefill): the replay copies no
input, gives what a copied batch gives, and padding still follows the step's size."""

from __future__ import annotations

import pytest
import torch
from runner_helpers import admit, captured_runner, decode_batch, make_model_runner, prefill_eagerly, prompts_of

from cudagraph.backend.testing import CpuReplayBackend
from cudagraph.config import Backend
from cudagraph.engine.batch import extend_lens, make_decode_batch, make_extend_batch
from cudagraph.engine.testing import DispatchedOps
from cudagraph.runner import PADDING_KV_SLOT, ForwardMode, PrefillCudaGraphRunner
from cudagraph.runner.static_buffers import DECODE_FIELDS, StaticBuffers

COPY_OPS = ("aten.copy_", "aten._foreach_copy_")


def copies_dispatched(step) -> list[str]:
    """The copy ops ``step()`` dispatched (a copy into a static buffer is one of them)."""
    with DispatchedOps() as ops:
        step()
    return [op for op in ops.computed if op.startswith(COPY_OPS)]


def test_views_are_the_same_tensors_at_every_call_and_cover_every_field() -> None:
    inputs = StaticBuffers.allocate(DECODE_FIELDS, 8, 8, torch.device("cpu"), seq_len_fill_value=1)
    first, second = inputs.views(3, 3), inputs.views(3, 3)
    assert set(first) == {spec.name for spec in DECODE_FIELDS} | {"seq_lens_cpu"}
    assert all(first[name] is second[name] for name in first)
    assert all(view.shape == (3,) for view in first.values())
    assert first["input_ids"].data_ptr() == inputs.tensors["input_ids"].data_ptr()


@pytest.mark.parametrize("batch_size", [1, 3, 8])
def test_a_step_written_into_the_views_replays_without_a_copy_and_gives_the_copied_logits(batch_size: int) -> None:
    model_runner = make_model_runner()
    runner, backend = captured_runner(model_runner)
    requests = admit(model_runner, prompts_of([3 + (i % 5) for i in range(batch_size)], seed=batch_size))
    prefill_eagerly(model_runner, requests)
    copied = runner.replay(make_decode_batch(requests, model_runner.device)).clone()
    views = runner.input_views(batch_size)
    assert views is not None
    in_place = make_decode_batch(requests, model_runner.device, views)
    assert in_place.input_ids is views["input_ids"] and in_place.seq_lens_cpu is views["seq_lens_cpu"]
    # The test double's replay copies its outputs back (as a breakable graph's eager calls do): all a step may copy.
    graph_copies = copies_dispatched(lambda: runner.replay_bucket(runner.pad_to_bucket(batch_size)))
    logits: list[torch.Tensor] = []
    assert copies_dispatched(lambda: logits.append(runner.replay(in_place))) == graph_copies
    torch.testing.assert_close(logits[0], copied)
    assert backend.replayed == [runner.pad_to_bucket(batch_size)] * 3


def test_a_copied_step_still_copies_every_field() -> None:
    model_runner = make_model_runner()
    runner, _ = captured_runner(model_runner)
    batch = decode_batch(model_runner, 3)
    copies = copies_dispatched(lambda: runner.replay(batch))
    graph_copies = copies_dispatched(lambda: runner.replay_bucket(runner.pad_to_bucket(3)))  # planned for it now
    # One fused copy of the int64 fields, one copy of the int32 seq_lens (the host mirror is off: torch attention).
    input_copies = list(copies)
    for op in graph_copies:
        input_copies.remove(op)
    assert sorted(input_copies) == ["aten._foreach_copy_.default", "aten.copy_.default"]


def test_a_smaller_step_in_place_after_a_larger_one_still_pads_the_rows_it_left() -> None:
    model_runner = make_model_runner()
    runner, _ = captured_runner(model_runner)
    runner.replay(decode_batch(model_runner, 8, seed=1))
    requests = admit(model_runner, prompts_of([4, 5, 6], seed=2))
    prefill_eagerly(model_runner, requests)
    views = runner.input_views(3)
    assert views is not None
    runner.replay(make_decode_batch(requests, model_runner.device, views))
    assert runner.static_buffers.tensors["out_cache_loc"][3:4].tolist() == [PADDING_KV_SLOT]  # bucket 4's padded row


def test_only_fields_written_in_place_skip_their_copy() -> None:
    """A batch mixing views and its own tensors: the in-place fields are not copied, the others are."""
    inputs = StaticBuffers.allocate(DECODE_FIELDS, 8, 8, torch.device("cpu"), seq_len_fill_value=1)
    views = inputs.views(2, 2)
    model_runner = make_model_runner()
    requests = admit(model_runner, prompts_of([3, 4]))
    prefill_eagerly(model_runner, requests)
    own = make_decode_batch(requests, model_runner.device)
    views["input_ids"].copy_(own.input_ids)
    mixed = own.__class__(**{**own.__dict__, "input_ids": views["input_ids"]})
    assert copies_dispatched(lambda: inputs.copy_in(mixed, 2, 2))  # positions, slots, rows and lengths still copy
    for spec in DECODE_FIELDS:
        assert torch.equal(inputs.tensors[spec.name][:2], getattr(own, spec.name)), spec.name


def test_input_views_are_none_where_a_step_would_run_eagerly(model_runner) -> None:
    runner, _ = captured_runner(model_runner)
    assert runner.input_views(9) is None  # beyond the largest bucket
    assert runner.input_views(0) is None
    assert model_runner.input_views(ForwardMode.EXTEND, 1) is None
    assert model_runner.input_views(ForwardMode.DECODE, 1) is None  # a CPU engine holds no runner of its own


@pytest.mark.parametrize("lengths", [[5], [7, 11, 3], [30, 20]])
def test_an_extend_step_written_into_the_prefill_views_replays_without_an_input_copy(lengths: list[int]) -> None:
    model_runner = make_model_runner()
    runner = PrefillCudaGraphRunner(
        model_runner, model_runner.cuda_graph_config, backend=CpuReplayBackend(Backend.BREAKABLE), show_progress=False
    )
    runner.capture()
    requests = admit(model_runner, prompts_of(lengths, seed=len(lengths)))
    copied_batch = make_extend_batch(requests, model_runner.device)
    eager = model_runner.forward(copied_batch).clone()
    copied_copies = copies_dispatched(lambda: runner.replay(copied_batch))
    views = runner.input_views(sum(lengths), len(lengths))
    assert views is not None and {"extend_seq_lens", "extend_prefix_lens", "extend_start_loc"} <= set(views)
    in_place = make_extend_batch(requests, model_runner.device, into=views)
    assert in_place.extend_start_loc is views["extend_start_loc"]
    logits: list[torch.Tensor] = []
    in_place_copies = copies_dispatched(lambda: logits.append(runner.replay(in_place)))
    # The copied step copies both dtype groups (int64 and int32 fields) and, where kept, the host lengths' mirror;
    # the step in place none of them.
    for op in in_place_copies:
        copied_copies.remove(op)
    mirror = ["aten.copy_.default"] if runner.static_buffers.mirror_seq_lens_cpu else []
    assert sorted(copied_copies) == ["aten._foreach_copy_.default"] * 2 + mirror
    torch.testing.assert_close(logits[0], eager, rtol=1e-5, atol=1e-5)


def test_prefill_input_views_are_none_where_the_step_would_run_eagerly(model_runner) -> None:
    runner = PrefillCudaGraphRunner(
        model_runner, model_runner.cuda_graph_config, backend=CpuReplayBackend(Backend.BREAKABLE), show_progress=False
    )
    runner.capture()
    assert runner.input_views(65, 1) is None  # beyond the largest token bucket (64)
    assert runner.input_views(0, 0) is None
    assert runner.input_views(16, 17) is None  # more requests than the graph has rows for
    assert extend_lens(admit(model_runner, prompts_of([5, 9])), limits=[4, 20]) == [4, 9]
