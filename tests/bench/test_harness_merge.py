"""``bench/run.py merge``: runs of one machine split over several calls become one result; rows keep the ratios of
their own run, a re-measured row comes from the last run, and runs of another machine are refused."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
from harness.merge import MergeError, merge_results
from harness.rows import BenchResult, BreakRow
from results_factory import decode_rows, sample_result

ROOT = Path(__file__).resolve().parents[2]


def decode_only(batch_sizes: tuple[int, ...], slower: float = 1.0) -> BenchResult:
    result = BenchResult(environment={"device": "NVIDIA H100 80GB HBM3", "torch": "2.11.0"}, settings={"run": 1})
    result.decode = decode_rows({"eager": 30.0, "raw": 2.0, "full": 2.02 * slower}, batch_sizes)
    return result


def test_sections_of_separate_runs_end_up_in_one_result_with_their_own_ratios() -> None:
    decode = decode_only((1, 8))
    breaks = BenchResult(environment=dict(decode.environment), settings={"run": 2})
    breaks.breaks = [
        BreakRow("ours", "model", 16, 40.0, 5.0, 1.6),
        BreakRow("breakable-cuda-graphs", "model", 16, 86.0, 4.4, 1.6),
    ]
    merged = merge_results([("decode.json", decode), ("breaks.json", breaks)])
    assert merged.decode == decode.decode
    assert merged.breaks == breaks.breaks
    assert merged.settings["merged_from"] == [
        {"file": "decode.json", "settings": {"run": 1}},
        {"file": "breaks.json", "settings": {"run": 2}},
    ]


def test_a_row_measured_twice_comes_from_the_last_run() -> None:
    early = decode_only((1, 8))
    late = decode_only((8, 128), slower=1.5)
    merged = merge_results([("early.json", early), ("late.json", late)])
    by_key = {(row.backend, row.batch_size): row for row in merged.decode}
    assert len(merged.decode) == 3 * 3  # batch 1 from the early run, 8 and 128 from the late one
    late_full_8 = next(row for row in late.decode if (row.backend, row.batch_size) == ("full", 8))
    early_full_1 = next(row for row in early.decode if (row.backend, row.batch_size) == ("full", 1))
    assert by_key[("full", 8)] == late_full_8 and by_key[("full", 8)].to_raw == pytest.approx(1.515)
    assert by_key[("full", 1)] == early_full_1


def test_runs_of_another_machine_or_version_are_refused_by_name() -> None:
    h100 = decode_only((1,))
    h200 = dataclasses.replace(decode_only((1,)), environment={"device": "NVIDIA H200", "torch": "2.11.0"})
    with pytest.raises(MergeError, match=r"b\.json was not measured on the machine of a\.json: device"):
        merge_results([("a.json", h100), ("b.json", h200)])
    newer = dataclasses.replace(decode_only((1,)), environment={"device": "NVIDIA H100 80GB HBM3", "torch": "2.13.0"})
    with pytest.raises(MergeError, match=r"torch '2\.11\.0' vs '2\.13\.0'"):
        merge_results([("a.json", h100), ("c.json", newer)])
    with pytest.raises(MergeError, match="at least one"):
        merge_results([])


def test_the_command_writes_a_result_compare_and_load_read(tmp_path: Path) -> None:
    first, second = sample_result(), decode_only((256,))
    second.environment = dict(first.environment)
    paths = [tmp_path / "one.json", tmp_path / "two.json"]
    for path, result in zip(paths, (first, second), strict=True):
        path.write_text(result.to_json())
    out = tmp_path / "merged" / "all.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run.py"), "merge", *map(str, paths), "--out", str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    merged = BenchResult.load(out)
    assert {row.batch_size for row in merged.decode} == {1, 8, 256}
    assert merged.breaks == first.breaks and merged.migration == first.migration
    assert "from 2 runs" in done.stdout

    paths[1].write_text(json.dumps({**json.loads(paths[1].read_text()), "environment": {"device": "cpu"}}))
    refused = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run.py"), "merge", *map(str, paths), "--out", str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert refused.returncode == 2 and "two.json was not measured on the machine of one.json" in refused.stderr
