"""The bucket-grid lines of ``explain()``: segments, worst padding per size range, and what replays."""

from __future__ import annotations

import pytest

from cudagraph.config import Backend, Phase, PhaseConfig, resolve
from cudagraph.config.grid import eager_by_ratio, explain_grid, grid_segments


def grid_lines(config_text: str) -> dict[str, str]:
    """``<phase>.grid|padding|replays`` -> the text after the key, from an ``explain()``."""
    lines = {}
    for line in config_text.splitlines():
        key, _, text = line.partition(" ")
        if key.endswith((".grid", ".padding", ".replays")):
            lines[key] = text.strip()
    return lines


def test_the_default_grids() -> None:
    assert grid_lines(resolve().explain()) == {
        "decode.grid": "35 buckets: 1 2 4, then every 8 to 256",
        "decode.padding": "sizes 1..4 worst 1.33x at 3 -> 4; 5..256 worst 1.78x at 9 -> 16",
        "decode.replays": "sizes 1..256 pad up to the next bucket; above 256 run eagerly",
        "prefill.grid": "32 buckets: every 16 to 256, then every 64 to 1024, then every 256 to 2048",
        "prefill.padding": "sizes 1..256 worst 16x at 1 -> 16; 257..1024 worst 1.25x at 257 -> 320; 1025..2048 worst "
        "1.25x at 1025 -> 1280",
        "prefill.replays": "sizes 1..2048 pad up to the next bucket; above 2048 run eagerly",
    }


def test_a_larger_decode_max_continues_the_schedule() -> None:
    lines = grid_lines(resolve(decode_cuda_graph_max_bs=300, prefill_disable_cuda_graph=True).explain())
    assert lines == {
        "decode.grid": "38 buckets: 1 2 4, then every 8 to 256, then 272 288 300",
        "decode.padding": "sizes 1..4 worst 1.33x at 3 -> 4; 5..256 worst 1.78x at 9 -> 16; 257..300 worst 1.06x at "
        "257 -> 272",
        "decode.replays": "sizes 1..300 pad up to the next bucket; above 300 run eagerly",
    }


def test_an_appended_max_and_a_padding_ratio() -> None:
    config = resolve(
        decode_cuda_graph_bs=[1, 2, 4],
        decode_cuda_graph_max_bs=64,
        decode_cuda_graph_max_padding_ratio=1.5,
        prefill_disable_cuda_graph=True,
    )
    assert grid_lines(config.explain()) == {
        "decode.grid": "4 buckets: 1 2 4 64 (the max 64 appended as the last bucket)",
        "decode.padding": "sizes 1..64 worst 12.8x at 5 -> 64",
        "decode.replays": "sizes 1..64 pad up to the next bucket; above 64 run eagerly; max_padding_ratio 1.5 sends "
        "5..42 eagerly (38 sizes)",
    }


def test_a_ratio_the_grid_never_exceeds_sends_nothing_eagerly() -> None:
    config = resolve(decode_cuda_graph_max_padding_ratio=2)
    assert grid_lines(config.explain())["decode.replays"].endswith("; max_padding_ratio 2 sends no size eagerly")


def test_disabled_padding() -> None:
    lines = grid_lines(resolve(disable_cuda_graph_padding=True, decode_cuda_graph_max_bs=16).explain())
    assert lines["decode.padding"] == "none: padding is disabled"
    assert lines["decode.replays"] == "only the 5 bucket sizes (padding disabled); other sizes run eagerly"


def test_many_eager_ranges_are_abbreviated() -> None:
    config = PhaseConfig(Backend.FULL, tuple(range(10, 201, 10)), 200, max_padding_ratio=1.05)
    replays = dict(explain_grid(Phase.PREFILL, config))["prefill.replays"]
    assert replays.endswith(
        "max_padding_ratio 1.05 sends 1..9, 11..19, 21..28, 31..38, ..., 161, 171 eagerly (90 sizes)"
    )
    assert len(eager_by_ratio(config)) == 18  # 181 -> 190 and 191 -> 200 pad less than 5%


@pytest.mark.parametrize(
    ("buckets", "described"),
    [
        ((1, 2, 4, 8, 16, 24, 32), ["1 2 4", "every 8 to 32"]),
        ((16, 24, 32, 40), ["every 8 from 16 to 40"]),
        ((3, 4, 5, 6, 100), ["3..6", "100"]),
        ((64,), ["64"]),
        (tuple(range(1, 40, 3)), ["every 3 from 1 to 37"]),
        ((1, 5, 9, 20, 31, 42, 43), ["every 4 from 1 to 9", "every 11 from 20 to 42", "43"]),
        (tuple(sorted({2**k for k in range(14)})), ["1 2 4 8 16 32 ... 2048 4096 8192"]),
    ],
)
def test_segments(buckets: tuple[int, ...], described: list[str]) -> None:
    assert [segment.describe() for segment in grid_segments(buckets)] == described


def test_an_enabled_phase_without_buckets() -> None:
    assert explain_grid(Phase.DECODE, PhaseConfig(Backend.FULL, (), 0)) == (
        ("decode.grid", "no buckets: every size runs eagerly"),
    )
