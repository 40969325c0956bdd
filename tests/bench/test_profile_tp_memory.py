"""``bench/profile_tp_memory.py``'s table on CPU: one row per part of a rank's graph memory (the head's gather
buffer and the collectives' buffers each in a row of their own, apart from the graphs), one column per rank."""

from __future__ import annotations

import profile_tp_memory

GIB = 2**30


def rank_figures(rank: int, warmed: bool, head_bytes: int) -> dict[str, object]:
    return {
        "rank": rank,
        "warmed": warmed,
        "collective_buffers_gib": 0.463 if warmed else 0.0,
        "head_gather_buffer_gib": 0.0625,
        "head_gather_buffer_bytes": head_bytes,
        "decode": {"total_gib": 0.5, "torch_reserved_gib": 0.25, "outside_torch_gib": 0.25},
        "repeat_gib": 0.3,
        "estimate_gib": 0.35,
    }


def test_each_part_is_a_row_with_a_figure_per_rank() -> None:
    ranks = [rank_figures(0, True, GIB // 16), rank_figures(1, True, GIB // 8)]
    rows = dict(profile_tp_memory.part_rows(ranks))
    assert rows["head gather buffer (outside the graphs, shared)"] == [0.0625, 0.125]
    assert rows["collective buffers (warm-up, outside the graphs)"] == [0.463, 0.463]
    assert rows["decode graphs: torch's pool"] == [0.25, 0.25]
    assert rows["decode graphs: taken in all"] == [0.5, 0.5]
    assert list(rows) == [name for name, _ in profile_tp_memory.PARTS]


def test_the_table_has_a_column_per_rank_and_a_dash_where_nothing_was_measured() -> None:
    table = profile_tp_memory.format_parts("TP=2", [rank_figures(0, False, 0), rank_figures(1, False, GIB // 16)])
    lines = table.splitlines()
    assert lines[0] == "TP=2:" and lines[2] == "| part | rank 0 GiB | rank 1 GiB |"
    assert "| collective buffers (warm-up, outside the graphs) | - | - |" in lines
    assert "| head gather buffer (outside the graphs, shared) | 0.000 | 0.062 |" in lines
