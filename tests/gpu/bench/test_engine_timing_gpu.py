"""The engine's decode timing (``harness.engine_timing``) on a real GPU: the host-cost measurement runs end to end
with torch, FlashInfer and Triton attention, and the device timeline of back-to-back replays shows each attention
kernel between two graph segments."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
from attention_params import attention_params

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="GPU test: needs a CUDA build of torch; run `nox -s gpu` on a CUDA machine")

from harness.engine_timing import measure_host_costs, runner_replay_timeline  # noqa: E402

from cudagraph.config import Backend, CudaGraphConfig, PhaseConfig  # noqa: E402
from cudagraph.engine.model import ModelConfig, model_config_from_preset, random_model  # noqa: E402
from cudagraph.engine.model_runner import CacheConfig, ModelRunner  # noqa: E402

EAGER = CudaGraphConfig(PhaseConfig(Backend.DISABLED, (), 0), PhaseConfig(Backend.DISABLED, (), 0))
# FlashInfer's decode kernels are built for head dims 64, 128 and 256; the tiny presets use 32.
HEAD_DIM_64 = model_config_from_preset("tiny-qwen3-random").with_overrides(head_dim=64)
ATTENTION: dict[str, tuple[str | ModelConfig, str]] = {
    "torch": ("tiny-qwen3-random", "float32"),
    "flashinfer": (HEAD_DIM_64, "bfloat16"),
    "triton": (HEAD_DIM_64, "bfloat16"),
}
"""Attention backend -> (model, dtype) it is timed with."""


@contextlib.contextmanager
def engine(attention: str) -> Iterator[ModelRunner]:
    """An eager CUDA engine with random weights (the timing builds its own runners); shut down on exit."""
    preset, dtype = ATTENTION[attention]
    model_config = model_config_from_preset(preset) if isinstance(preset, str) else preset
    model = random_model(model_config, seed=3, dtype=dtype, device="cuda")
    cache = CacheConfig(max_num_reqs=80, max_context_len=160)
    runner = ModelRunner(model, EAGER, cache_config=cache, attention_backend=attention)
    try:
        yield runner
    finally:
        runner.shutdown()


@pytest.mark.parametrize("attention", attention_params())
def test_host_costs_are_measured_for_every_batch_size(attention: str) -> None:
    with engine(attention) as model_runner:
        costs = measure_host_costs(model_runner, [1, 4], context_len=32, repeats=10)
    assert [cost.batch_size for cost in costs] == [1, 4]
    for cost in costs:
        assert cost.breaks == model_runner.shape.num_layers
        assert min(cost.raw_us, cost.full_us, cost.full_in_place_us, cost.breakable_us) > 0
        assert not cost.device_waited, "a host timing waited on the device: it measured GPU time, not host work"


def test_a_breakable_replay_runs_what_a_full_replay_runs_with_each_attention_kernel_between_two_segments() -> None:
    """The device timeline of back-to-back replays: the same activities a step in both (no kernel added by the
    breaks), and one transition into the Triton decode kernel per layer; the printed transitions show what each
    break costs on the device."""
    with engine("triton") as model_runner:
        full = runner_replay_timeline(model_runner, "full", 1, context_len=32, steps=3)
        breakable = runner_replay_timeline(model_runner, "breakable", 1, context_len=32, steps=3)
        layers = model_runner.shape.num_layers
    print(f"full:\n{full.format()}\nbreakable:\n{breakable.format()}")
    assert breakable.activities == full.activities
    for timeline in (full, breakable):
        into_attention = sum(item.count for item in timeline.transitions if item.after == "_paged_decode_kernel")
        assert into_attention == layers
        assert timeline.busy_us > 0 and timeline.idle_us >= 0
