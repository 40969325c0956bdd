"""``compare``: a ratio more than 10 % worse is flagged (in the direction that is worse for it), a smaller change is
not, and the command exits 1 only when something regressed."""

from __future__ import annotations

import dataclasses

from harness.compare import Ratio, is_regression, ratios_of, regressions
from results_factory import sample_result, scaled


def test_a_15_percent_slower_full_step_is_flagged_and_a_5_percent_one_is_not() -> None:
    old = sample_result()
    flagged = {regression.key for regression in regressions(old, scaled(old, "full", 1.15))}
    assert flagged == {
        f"decode/qwen3-0.6b/full/bs{bs}/{ratio}" for bs in (1, 8) for ratio in ("to_raw", "to_eager", "floor_fraction")
    }
    assert regressions(old, scaled(old, "full", 1.05)) == []


def test_a_faster_reference_makes_every_ratio_to_it_worse() -> None:
    old = sample_result()
    keys = {regression.key for regression in regressions(old, scaled(old, "raw", 1 / 1.2))}
    assert "decode/qwen3-0.6b/full/bs1/to_raw" in keys
    assert "decode/qwen3-0.6b/full/bs1/to_eager" not in keys


def test_a_flag_caused_by_a_faster_reference_row_says_so() -> None:
    old = sample_result()
    found = regressions(old, scaled(old, "eager", 1 / 1.5))
    to_eager = [regression for regression in found if regression.key.endswith("/to_eager")]
    assert to_eager and all("the eager step itself went" in regression.note for regression in to_eager)
    assert "the eager step itself went" in str(to_eager[0])
    slower_full = regressions(old, scaled(old, "full", 1.15))
    assert slower_full and all(regression.note == "" for regression in slower_full)


def test_direction_matters_for_higher_is_better_ratios() -> None:
    old = Ratio("prefill/x/speedup", 3.0, higher_is_better=True)
    assert is_regression(old, Ratio(old.key, 3.0 / 1.15, True))
    assert not is_regression(old, Ratio(old.key, 3.0 / 1.05, True))
    assert not is_regression(old, Ratio(old.key, 4.0, True))
    lower = Ratio("decode/x/to_raw", 1.0, higher_is_better=False)
    assert is_regression(lower, Ratio(lower.key, 1.15, False)) and not is_regression(
        lower, Ratio(lower.key, 0.8, False)
    )


def test_prefill_breaks_and_migration_ratios_are_compared() -> None:
    old = sample_result()
    keys = set(ratios_of(old))
    assert "prefill/qwen3-0.6b/breakable/1x64/speedup" in keys
    assert "breaks/model/ours_over_breakable-cuda-graphs" in keys
    assert "migration/generated-10/j4_speedup" in keys
    slower_prefill = dataclasses.replace(
        old,
        prefill=[dataclasses.replace(row, speedup=2.0) if row.backend == "breakable" else row for row in old.prefill],
    )
    assert [r.key for r in regressions(old, slower_prefill)] == ["prefill/qwen3-0.6b/breakable/1x64/speedup"]
