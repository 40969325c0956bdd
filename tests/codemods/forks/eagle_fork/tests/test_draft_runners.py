"""The fork's draft runners keep the fork's limit and counters, whatever runs their graphs."""

from eagle_fork.build import build_draft_runners
from eagle_fork.doubles import CpuEagleWorker, decode_batch, verify_batch


def test_the_draft_runner_graphs_only_up_to_the_fork_s_limit() -> None:
    draft, _ = build_draft_runners(CpuEagleWorker(buckets=(1, 2, 4, 8, 16)))
    assert [draft.can_run(decode_batch(size)) for size in (1, 3, 8)] == [True, True, True]
    assert not draft.can_run(decode_batch(9))  # a bucket of 16 is captured, but past the fork's limit
    assert not draft.can_run(decode_batch(17))


def test_the_limit_is_the_fork_s_own_and_a_subclass_can_lower_it() -> None:
    draft, _ = build_draft_runners(CpuEagleWorker(buckets=(1, 2, 4)))
    assert draft.graph_request_limit == 8
    assert draft.can_run(decode_batch(4)) and not draft.can_run(decode_batch(5))  # the buckets end first
    draft.graph_request_limit = 2
    assert draft.can_run(decode_batch(2)) and not draft.can_run(decode_batch(3))


def test_each_runner_captures_once_when_built() -> None:
    draft, extend = build_draft_runners(CpuEagleWorker())
    assert draft.capture_calls == 1
    assert extend.refused == 0


def test_the_draft_extend_runner_counts_what_it_sends_eager() -> None:
    _, extend = build_draft_runners(CpuEagleWorker(buckets=(1, 2, 4)))
    assert not extend.can_run(verify_batch(5))
    assert not extend.can_run(verify_batch(9))
    assert extend.refused == 2
