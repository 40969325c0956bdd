"""Default bucket schedules, the GPU-memory table for the decode max, and explicit bucket lists."""

from __future__ import annotations

import itertools

import pytest
from config_helpers import recorded_warnings, resolve_argv

from cudagraph.config import (
    DECODE_MAX_BS_BY_GPU_MEMORY,
    ConfigError,
    Environment,
    Phase,
    default_buckets,
    resolve,
)


def test_decode_schedule_at_256_is_the_issue_formula() -> None:
    assert default_buckets(Phase.DECODE, 256) == (1, 2, 4, *range(8, 257, 8))


def test_decode_schedule_continues_in_steps_of_16() -> None:
    assert default_buckets(Phase.DECODE, 512) == (1, 2, 4, *range(8, 257, 8), *range(272, 513, 16))


@pytest.mark.parametrize(
    ("max_size", "tail"), [(1, (1,)), (3, (1, 2, 3)), (100, (88, 96, 100)), (300, (272, 288, 300))]
)
def test_decode_schedule_is_capped_at_the_max(max_size: int, tail: tuple[int, ...]) -> None:
    buckets = default_buckets("decode", max_size)
    assert buckets[-len(tail) :] == tail
    assert buckets[-1] == max_size and all(size < max_size for size in buckets[:-1])


def test_prefill_schedule_grows_its_step() -> None:
    buckets = default_buckets(Phase.PREFILL, 2048)
    assert buckets == (*range(16, 257, 16), *range(320, 1025, 64), 1280, 1536, 1792, 2048)
    assert 24 <= len(buckets) <= 48  # a few dozen
    steps = [b - a for a, b in itertools.pairwise(buckets)]
    assert steps == sorted(steps)


def test_prefill_schedule_below_its_first_size() -> None:
    assert default_buckets(Phase.PREFILL, 10) == (10,)


@pytest.mark.parametrize("phase", list(Phase))
@pytest.mark.parametrize("max_size", [1, 7, 64, 255, 257, 1000, 5000])
def test_schedules_are_ascending_unique_and_bounded(phase: Phase, max_size: int) -> None:
    buckets = default_buckets(phase, max_size)
    assert list(buckets) == sorted(set(buckets)) and buckets[0] >= 1 and buckets[-1] == max_size


@pytest.mark.parametrize(("max_size", "shown"), [(0, "0"), (-4, "-4"), (2.0, "2.0"), (True, "True"), ("8", "'8'")])
def test_default_buckets_rejects_bad_max(max_size: object, shown: str) -> None:
    with pytest.raises(ConfigError, match=rf"^max_size: {shown} is not allowed; allowed: positive integers$"):
        default_buckets(Phase.DECODE, max_size)  # type: ignore[arg-type]


def test_default_buckets_rejects_unknown_phase() -> None:
    with pytest.raises(ConfigError, match=r"^phase: unknown phase 'extend'; allowed phases: decode, prefill$"):
        default_buckets("extend", 8)


@pytest.mark.parametrize(
    ("gib", "max_bs"), [(8, 32), (19.9, 32), (20, 128), (24, 128), (40, 256), (80, 256), (90, 512), (141, 512)]
)
def test_decode_max_follows_gpu_memory(gib: float, max_bs: int) -> None:
    config = resolve(environment=Environment(gpu_memory_gib=gib))
    assert config.decode.max_size == max_bs and config.decode.buckets == default_buckets(Phase.DECODE, max_bs)
    assert config.sources["decode.max_size"] == f"default for {gib:g} GiB of GPU memory"
    assert config.prefill == resolve().prefill  # prefill does not scale with memory


def test_gpu_memory_table_is_ascending() -> None:
    bounds = [bound for bound, _ in DECODE_MAX_BS_BY_GPU_MEMORY]
    sizes = [size for _, size in DECODE_MAX_BS_BY_GPU_MEMORY]
    assert bounds == sorted(bounds) and sizes == sorted(sizes) and bounds[-1] == float("inf")


def test_explicit_max_beats_gpu_memory() -> None:
    config = resolve(decode_cuda_graph_max_bs=48, environment=Environment(gpu_memory_gib=141))
    assert config.decode.max_size == 48


def test_explicit_lists_are_sorted_and_deduplicated() -> None:
    config = resolve(decode_cuda_graph_bs=["8", 1, 8, "4"], prefill_cuda_graph_tokens=(512, 64, 64))
    assert config.decode.buckets == (1, 4, 8) and config.prefill.buckets == (64, 512)


@pytest.mark.parametrize(
    "tokens",
    [["1", "2", "4"], ["1,2,4"], ["1,2", "4"], ["4", "1, 2"], ["1 2 4"], [" 1,2 ,4 "], ["4,2,1", "2"]],
    ids=repr,
)
def test_bucket_lists_accept_spaces_commas_and_mixtures(tokens: list[str]) -> None:
    expected = resolve(decode_cuda_graph_bs=[1, 2, 4])
    assert resolve_argv(["--decode-cuda-graph-bs", *tokens]) == expected
    assert resolve_argv(["--prefill-cuda-graph-tokens", *tokens]).prefill.buckets == (1, 2, 4)
    with recorded_warnings():
        assert resolve_argv(["--cuda-graph-bs", *tokens]) == expected  # legacy spelling too


def test_python_string_is_a_bucket_list_like_a_command_line_token() -> None:
    assert (
        resolve(decode_cuda_graph_bs="1,2,4")
        == resolve(decode_cuda_graph_bs="1 2 4")
        == resolve_argv(["--decode-cuda-graph-bs", "1,2,4"])
    )
