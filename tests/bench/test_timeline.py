"""The device timeline's arithmetic on recorded activities: idle time by transition, per step."""

from __future__ import annotations

import pytest
from harness.timeline import DeviceActivity, StepTimeline, short_name, summarize


@pytest.mark.parametrize(
    ("name", "short"),
    [
        ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<long>>(int, T1, T2)",
         "at::native::vectorized_elementwise_kernel"),
        ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<TensorListMetadata<2>>(T, U)",
         "at::native::multi_tensor_apply_kernel"),
        ("_gemv_kernel", "_gemv_kernel"),
        ("Memcpy DtoD (Device -> Device)", "Memcpy DtoD"),
        ("nvjet_tst_64x8_64x16_4x1_v_bz_splitK_TNT", "nvjet_tst_64x8_64x16_4x1_v_bz_splitK_TNT"),
    ],
)  # fmt: skip
def test_short_names_drop_return_type_templates_and_parameters(name: str, short: str) -> None:
    assert short_name(name) == short


def two_steps() -> list[DeviceActivity]:
    """Two steps of gemv -> attention -> gemv; the first step's attention starts 3 us late, the second's 1 us."""
    activities = []
    for offset, late in ((0.0, 3.0), (100.0, 1.0)):
        activities += [
            DeviceActivity("_gemv_kernel", offset, offset + 10),
            DeviceActivity("_paged_decode_kernel", offset + 10 + late, offset + 20 + late),
            DeviceActivity("void gemm<8>(float*)", offset + 21 + late, offset + 30 + late),
        ]
    return activities


def test_idle_time_is_summed_per_transition_and_divided_by_steps() -> None:
    timeline = summarize(reversed(two_steps()), steps=2)  # any order in, sorted by start
    assert isinstance(timeline, StepTimeline)
    assert timeline.activities == 3
    assert timeline.busy_us == pytest.approx(29.0)
    by_pair = {(item.before, item.after): item for item in timeline.transitions}
    into = by_pair[("_gemv_kernel", "_paged_decode_kernel")]
    assert (into.count, into.idle_us, into.mean_idle_us) == (1.0, 2.0, 2.0)  # (3 + 1) / 2 steps
    out = by_pair[("_paged_decode_kernel", "gemm")]
    assert (out.count, out.idle_us) == (1.0, 1.0)
    between_steps = by_pair[("gemm", "_gemv_kernel")]
    assert between_steps.count == 0.5 and between_steps.idle_us == pytest.approx((100 - 33) / 2)
    assert timeline.transitions[0] is between_steps, "largest idle first"
    assert timeline.idle_us == pytest.approx(2.0 + 1.0 + 33.5)


def test_overlapping_activities_count_no_idle_time_and_idle_runs_from_the_latest_end() -> None:
    activities = [
        DeviceActivity("a", 0, 10),
        DeviceActivity("b", 2, 4),  # inside a: no idle
        DeviceActivity("c", 12, 13),  # idle from a's end (10), not b's (4)
    ]
    by_pair = {(item.before, item.after): item.idle_us for item in summarize(activities, steps=1).transitions}
    assert by_pair == {("a", "b"): 0.0, ("b", "c"): 2.0}


def test_the_timeline_is_json_ready_and_prints_its_largest_transitions() -> None:
    timeline = summarize(two_steps(), steps=2)
    data = timeline.as_dict()
    assert data["steps"] == 2 and data["transitions"][0]["mean_idle_us"] == pytest.approx(67.0)
    text = timeline.format(top=1)
    assert text.splitlines()[0].startswith("3 device activities a step, 29.0 us busy, 36.5 us idle")
    assert len(text.splitlines()) == 2 and "gemm -> _gemv_kernel" in text


def test_an_empty_recording_or_no_steps_is_refused_plainly() -> None:
    assert summarize([], steps=1).activities == 0
    with pytest.raises(ValueError, match="at least one step, got steps=0"):
        summarize([], steps=0)
