"""The benchmark harness on a real GPU: every configuration it times gives eager's greedy tokens, and the gate that
refuses a wrong answer does refuse one. Small sizes and few iterations: these prove the harness, they are not the
benchmark (``python3 bench/run.py --quick`` is).

The peers' tests need ``breakable-cuda-graphs`` and ``piecewise-cuda-graphs`` (``tests/gpu/run.py`` installs the
wheels carried in ``.whl/``); the compile tests take a minute or two of inductor compilation each.
"""

from __future__ import annotations

import dataclasses

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch", reason="GPU test: needs a CUDA build of torch; run `nox -s gpu` on a CUDA machine")

from harness.breaks import BreakSettings, run_empty_breaks, run_model_breaks  # noqa: E402
from harness.configs import DECODE_CONFIGS, PREFILL_CONFIGS, BenchConfig  # noqa: E402
from harness.measure import measure_step  # noqa: E402
from harness.prefill import PrefillSettings, run_prefill  # noqa: E402
from harness.profiles import Iterations  # noqa: E402
from harness.rows import BenchResult  # noqa: E402

from cudagraph.engine.model_runner import CacheConfig  # noqa: E402

PRESET = "qwen3-0.6b"
FEW = Iterations(warmup=2, timed=5)


def configs(table: tuple[BenchConfig, ...], *names: str) -> tuple[BenchConfig, ...]:
    chosen = tuple(config for config in table if config.name in names)
    assert [config.name for config in chosen] == list(names), "a name is missing from the table"
    return chosen


def run_decode_rows(models, *names: str, batch_sizes=(1, 4)) -> BenchResult:  # type: ignore[no-untyped-def]
    from harness.decode import DecodeSettings, run_decode
    from harness.timing import copy_bandwidth_bytes_per_second

    result = BenchResult()
    settings = DecodeSettings((PRESET,), batch_sizes, 64, FEW, configs=configs(DECODE_CONFIGS, *names))
    run_decode(result, settings, models, copy_bandwidth_bytes_per_second(1 << 28, repeats=3))
    return result


def assert_rows_for_every_config(result: BenchResult, names: tuple[str, ...], batch_sizes=(1, 4)) -> None:  # type: ignore[no-untyped-def]
    assert result.wrong == [], result.wrong
    assert result.skipped == [], result.skipped
    measured = {(row.backend, row.batch_size) for row in result.decode}
    assert measured == {(name, size) for name in names for size in batch_sizes}


def test_decode_graphs_of_ours_give_eager_tokens_and_ratios(models) -> None:  # type: ignore[no-untyped-def]
    names = ("eager", "raw", "full", "breakable")
    result = run_decode_rows(models, *names)
    assert_rows_for_every_config(result, names)
    rows = {(row.backend, row.batch_size): row for row in result.decode}
    for size in (1, 4):
        assert rows[("raw", size)].to_raw == pytest.approx(1.0)
        assert rows[("eager", size)].to_eager == pytest.approx(1.0)
        # Sanity, not the target: one graph is far faster than eager, and the runner adds little to a raw replay.
        assert rows[("full", size)].to_eager < 0.8
        assert rows[("full", size)].to_raw < 1.5
        assert rows[("full", size)].kernels_per_step is not None and rows[("full", size)].kernels_per_step > 28
        assert 0 < rows[("full", size)].floor_fraction < 1.05


def test_decode_peers_give_eager_tokens(models, peers: None) -> None:  # type: ignore[no-untyped-def]
    names = ("eager", "raw", "breakable-cuda-graphs", "piecewise-cuda-graphs")
    assert_rows_for_every_config(run_decode_rows(models, *names), names)


def test_decode_torch_compile_reduce_overhead_gives_eager_tokens(models) -> None:  # type: ignore[no-untyped-def]
    names = ("eager", "raw", "torch.compile")
    assert_rows_for_every_config(run_decode_rows(models, *names), names)


def test_decode_tc_piecewise_rows_give_eager_tokens(models) -> None:  # type: ignore[no-untyped-def]
    names = ("eager", "tc_piecewise/eager", "tc_piecewise/inductor")
    assert_rows_for_every_config(run_decode_rows(models, *names, batch_sizes=(1,)), names, batch_sizes=(1,))


def test_the_token_gate_refuses_a_step_that_answers_for_another_batch(models) -> None:  # type: ignore[no-untyped-def]
    from harness.workload import build_model_runner, decode_batches

    model_runner = build_model_runner(
        PRESET, CacheConfig(max_num_reqs=16, max_context_len=128), "torch", models.get(PRESET)
    )
    result = BenchResult()
    with decode_batches(model_runner, 8, 64) as batches:
        other = dataclasses.replace(batches[0], input_ids=torch.roll(batches[0].input_ids, 1))
        measured = measure_step(
            result,
            "decode",
            "answers another batch",
            lambda batch: model_runner.forward(other),
            model_runner.forward,
            batches,
            FEW,
        )
    assert measured is None
    [wrong] = result.wrong
    assert wrong.what == "answers another batch" and "greedy tokens wrong" in wrong.detail


def test_breaks_of_ours_and_the_peers_on_the_16_layer_model(models, peers: None) -> None:  # type: ignore[no-untyped-def]
    result = BenchResult()
    settings = BreakSettings(Iterations(warmup=5, timed=30), context_len=64)
    run_model_breaks(result, settings, models)
    run_empty_breaks(result, settings)
    assert result.wrong == [] and result.skipped == []
    rows = {(row.implementation, row.workload): row for row in result.breaks}
    assert set(rows) == {
        (name, workload)
        for name in ("ours", "breakable-cuda-graphs", "piecewise-cuda-graphs")
        for workload in ("model", "empty")
    }
    assert all(row.breaks == 16 for row in result.breaks)
    # Every break costs the host something: a graph split by breaks is never cheaper than one graph.
    assert all(row.host_us_per_break > 0 for row in result.breaks)


def test_prefill_rows_give_eager_tokens(models, peers: None) -> None:  # type: ignore[no-untyped-def]
    names = ("eager", "breakable", "breakable-cuda-graphs", "piecewise-cuda-graphs")
    result = BenchResult()
    settings = PrefillSettings((PRESET,), ((1, 16), (2, 32)), FEW, configs=configs(PREFILL_CONFIGS, *names))
    run_prefill(result, settings, models)
    assert result.wrong == [] and result.skipped == []
    measured = {(row.backend, row.requests, row.tokens_per_request) for row in result.prefill}
    assert measured == {(name, *shape) for name in names for shape in ((1, 16), (2, 32))}
    assert all(row.speedup is not None and row.speedup > 0 for row in result.prefill)


def test_capture_rows_count_the_default_buckets(models, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    from harness import capture

    backends = tuple(
        (phase, config) for phase, config in capture.CAPTURE_BACKENDS if config.name in ("full", "breakable")
    )
    monkeypatch.setattr(capture, "CAPTURE_BACKENDS", backends)
    # A row's bytes are the driver's free memory of the whole device before and after (torch.cuda.mem_get_info),
    # clamped at 0: another process using this device (a neighbour's context or rank on it, its cache returned) moves
    # them, and one that frees memory mid-capture makes them 0. What this process's capture reserved is its own:
    # each shape's growth of the allocator's reserved bytes (CaptureStats.per_bucket), recorded beside the row.
    reserved: dict[tuple[str, str], int] = {}
    capture_row = capture._capture_row

    def recording(preset, phase, backend, source):  # type: ignore[no-untyped-def]
        reserved[(phase, backend)] = sum(bucket.bytes for bucket in source.stats.per_bucket)
        return capture_row(preset, phase, backend, source)

    monkeypatch.setattr(capture, "_capture_row", recording)
    result = BenchResult()
    capture.run_capture(result, capture.CaptureSettings((PRESET,), 16, 64, PRESET, (1,)), models)
    assert result.wrong == [] and result.skipped == []
    rows = {(row.phase, row.backend): row for row in result.capture}
    assert rows[("decode", "full")].graphs == len((1, 2, 4, 8, 16))
    assert rows[("prefill", "breakable")].graphs == len((16, 32, 48, 64))
    assert all(row.seconds > 0 for row in result.capture)
    assert set(reserved) == set(rows) and all(bytes_ > 0 for bytes_ in reserved.values()), reserved
