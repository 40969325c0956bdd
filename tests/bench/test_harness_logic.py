"""The CPU-side logic of the measuring sections: the greedy-token gate, ratios and speed-ups, the configuration table,
and the migration section on a small generated tree."""

from __future__ import annotations

import pytest
import torch
from harness.configs import (
    DECODE_CONFIGS,
    PREFILL_CONFIGS,
    BenchConfig,
    Compiles,
    Kind,
    measurement_order,
    table_position,
)
from harness.make_source import SOURCE_FACTORIES, make_source
from harness.migration import MigrationSettings, run_migration
from harness.prefill import PrefillSettings
from harness.profiles import Iterations
from harness.rows import BenchResult, PrefillRow, with_speedups
from harness.sources import SourceUnavailableError
from harness.workload import LOGIT_TOLERANCE, TIE_TOLERANCE, check_tokens
from results_factory import decode_rows


def test_identical_logits_pass_the_token_gate() -> None:
    logits = torch.randn(4, 50)
    check = check_tokens(logits, logits.clone())
    assert check.ok and check.differing == 0 and check.max_abs_logit_diff == 0


def test_a_near_tie_is_accepted_and_a_real_difference_is_not() -> None:
    eager = torch.zeros(2, 10)
    eager[0, 3], eager[0, 7] = 5.0, 5.0 - TIE_TOLERANCE / 2  # row 0: tokens 3 and 7 nearly tie
    eager[1, 2], eager[1, 8] = 5.0, 4.3  # row 1: token 2 clearly best
    graph = eager.clone()
    graph[0, 7] = 5.1  # picks the near-tie
    tie = check_tokens(eager, graph)
    assert tie.ok and tie.differing == 1 and tie.wrong == 0
    graph[1, 8] = 5.2  # picks a token eager ranks 0.7 lower (more than a tie), every logit within the bound
    wrong = check_tokens(eager, graph)
    assert not wrong.ok and wrong.wrong == 1 and wrong.logits_close
    assert "1 of 2 greedy tokens wrong (1 near-ties)" in str(wrong)


def test_inductor_sized_moves_pass_and_logits_moved_further_fail_even_with_every_token_kept() -> None:
    generator = torch.Generator().manual_seed(0)
    eager = torch.randn(256, 64, generator=generator)
    nudged = eager + (torch.rand(eager.shape, generator=generator) - 0.5) * 0.6  # moves of up to 0.3, as measured
    check = check_tokens(eager, nudged)
    assert check.ok and check.max_abs_logit_diff <= 0.3
    assert check.differing > 0  # some top-two pairs closer than the moves flip; they are ties
    shifted = eager.clone()
    shifted[5] += torch.linspace(0, 1.5 * LOGIT_TOLERANCE, eager.shape[1]) * (shifted[5] < shifted[5].max())
    far = check_tokens(eager, shifted)
    assert far.wrong == 0 and not far.logits_close and not far.ok
    assert f"more than the {LOGIT_TOLERANCE:g} allowed" in str(far)


def test_nan_logits_and_wrong_shapes_fail_the_gate() -> None:
    eager = torch.randn(3, 8)
    assert not check_tokens(eager, torch.randn(2, 8)).ok
    broken = eager.clone()
    broken[1] = float("nan")
    assert check_tokens(eager, broken).max_abs_logit_diff == float("inf")


def test_decode_ratios_refer_to_raw_and_eager_of_the_same_batch() -> None:
    rows = {(row.backend, row.batch_size): row for row in decode_rows({"eager": 20.0, "raw": 2.0, "full": 2.2})}
    full = rows[("full", 8)]
    assert full.to_raw == pytest.approx(1.1)
    assert full.to_eager == pytest.approx(0.11)
    assert rows[("raw", 1)].to_raw == pytest.approx(1.0)


def test_decode_ratios_are_none_without_a_reference() -> None:
    rows = decode_rows({"full": 2.0})
    assert all(row.to_raw is None and row.to_eager is None for row in rows)


def test_prefill_speedup_is_eager_over_the_row_on_the_same_shape() -> None:
    rows = with_speedups(
        [
            PrefillRow("p", "eager", 1, 64, 30.0, 1.0),
            PrefillRow("p", "breakable", 1, 64, 10.0, 1.0),
            PrefillRow("p", "breakable", 8, 64, 10.0, 1.0),  # no eager row of that shape
        ]
    )
    assert [row.speedup for row in rows] == [1.0, 3.0, None]
    settings = PrefillSettings(("p",), ((1, 16), (8, 64), (1, 512)), Iterations(1, 1))
    assert settings.token_buckets == (16, 512)


def test_every_configuration_kind_has_a_source_and_references_come_first() -> None:
    assert set(SOURCE_FACTORIES) == set(Kind)
    assert [config.name for config in DECODE_CONFIGS[:2]] == ["eager", "raw"]
    assert PREFILL_CONFIGS[0].name == "eager"
    assert all(config.peer for config in (*DECODE_CONFIGS, *PREFILL_CONFIGS) if config.kind is Kind.PEER)


COMPILES_BY_ROW = {
    "eager": Compiles.NOTHING,
    "raw": Compiles.NOTHING,
    "full": Compiles.NOTHING,
    "full/pdl-off": Compiles.NOTHING,
    "breakable": Compiles.NOTHING,
    "breakable-cuda-graphs": Compiles.NOTHING,
    "piecewise-cuda-graphs": Compiles.NOTHING,
    "tc_piecewise/eager": Compiles.DYNAMO,
    "full+compiled": Compiles.INDUCTOR,
    "full+compiled/autotuned": Compiles.INDUCTOR,
    "tc_piecewise/inductor": Compiles.INDUCTOR,
    "torch.compile": Compiles.INDUCTOR,
}
"""What each row compiles, as stated by hand (the configs derive it from their kind and settings)."""


@pytest.mark.parametrize("configs", [DECODE_CONFIGS, PREFILL_CONFIGS], ids=["decode", "prefill"])
def test_rows_that_compile_are_measured_after_every_row_that_does_not(configs: tuple[BenchConfig, ...]) -> None:
    assert [config.compiles for config in configs] == [COMPILES_BY_ROW[config.name] for config in configs]
    ordered = measurement_order(configs)
    assert sorted(ordered, key=lambda config: config.name) == sorted(configs, key=lambda config: config.name)
    assert [config.compiles for config in ordered] == sorted(config.compiles for config in configs)
    assert ordered[0].name == "eager"
    assert any(config.compiles is Compiles.INDUCTOR for config in configs)
    plain = [config.name for config in configs if config.compiles is Compiles.NOTHING]
    assert [config.name for config in ordered[: len(plain)]] == plain


def test_rows_measured_out_of_order_go_back_to_table_order() -> None:
    measured = measurement_order(DECODE_CONFIGS)
    assert measured != DECODE_CONFIGS
    rows = decode_rows({config.name: 1.0 for config in measured})
    rows.sort(key=table_position(DECODE_CONFIGS))
    assert [(row.backend, row.batch_size) for row in rows] == [
        (config.name, batch_size) for config in DECODE_CONFIGS for batch_size in (1, 8)
    ]


def test_runner_rows_capture_exactly_the_measured_shapes() -> None:
    full = next(config for config in DECODE_CONFIGS if config.name == "full")
    config = full.runner_config({"decode": (1, 8, 32)})
    assert config.decode.backend == "full" and config.decode.buckets == (1, 8, 32)
    assert config.prefill.backend == "disabled"
    breakable = next(config for config in PREFILL_CONFIGS if config.name == "breakable")
    prefill = breakable.runner_config({"prefill": (64, 512)})
    assert prefill.prefill.buckets == (64, 512) and prefill.decode.backend == "disabled"


def test_a_setting_the_config_rejects_skips_the_row_with_the_reason() -> None:
    rejected = BenchConfig("full+unknown", Kind.RUNNER, {"decode_cuda_graph_backend": "full", "no_such_setting": 1})
    with pytest.raises(
        SourceUnavailableError, match="the config rejects it: unknown CUDA-graph setting 'no_such_setting'"
    ):
        make_source(rejected, None, {"decode": (1,)})  # type: ignore[arg-type]


@pytest.mark.slow  # deep: migrates a generated tree at each job count
def test_migration_section_times_each_job_count_on_a_generated_tree() -> None:
    result = BenchResult()
    run_migration(result, MigrationSettings(jobs=(1, 2), generated_files=6, use_real_tree=False))
    assert [(row.tree, row.files, row.jobs, row.exit_status) for row in result.migration] == [
        ("generated-6", 6, 1, 0),
        ("generated-6", 6, 2, 0),
    ]
    assert all(row.seconds > 0 and row.files_per_second > 0 for row in result.migration)


def test_rotating_batches_share_requests_and_slots_but_not_tensors_or_tokens() -> None:
    from harness.workload import EAGER_CONFIG, decode_batches, extend_batches

    from cudagraph.engine.model import model_config_from_preset, random_model
    from cudagraph.engine.model_runner import CacheConfig, ModelRunner

    model = random_model(model_config_from_preset("tiny-llama-random"))
    runner = ModelRunner(model, EAGER_CONFIG, cache_config=CacheConfig(max_num_reqs=9, max_context_len=64))
    rows_before = runner.req_to_token_pool.available
    for batches_of in (lambda: decode_batches(runner, 3, 8), lambda: extend_batches(runner, 2, 4)):
        with batches_of() as batches:
            first = batches[0]
            assert len({tuple(batch.input_ids.tolist()) for batch in batches}) == len(batches)
            for batch in batches[1:]:
                assert torch.equal(batch.out_cache_loc, first.out_cache_loc)
                assert batch.out_cache_loc.data_ptr() != first.out_cache_loc.data_ptr()
            assert not torch.equal(runner.forward(batches[1]), runner.forward(first))
        assert runner.req_to_token_pool.available == rows_before


def test_the_pdl_off_row_is_full_with_the_switch_off_while_it_is_captured_and_timed() -> None:
    pytest.importorskip("triton", reason="the PDL switch lives in the Triton kernels: pip install triton")
    from harness.decode import pdl_setting

    from cudagraph.engine.kernels.triton import pdl

    rows = {config.name: config for config in DECODE_CONFIGS}
    assert rows["full/pdl-off"].settings == rows["full"].settings and rows["full/pdl-off"].pdl is False
    assert all(config.pdl is None for name, config in rows.items() if name != "full/pdl-off")
    before = pdl.pdl_enabled()
    with pdl_setting(False):
        assert not pdl.pdl_enabled()
    with pdl_setting(None):
        assert pdl.pdl_enabled() is before
    assert pdl.pdl_enabled() is before


def test_a_phase_left_out_of_a_runner_row_is_off_even_when_the_row_names_its_backend() -> None:
    from harness.speculative import SPECULATIVE_CONFIG  # names prefill's backend (breakable)

    config = SPECULATIVE_CONFIG.runner_config({"decode": (1, 4)})
    assert config.decode.buckets == (1, 4)
    assert not config.prefill.enabled
