"""``bench/run.py --check``: a missed target is what fails a job; the scripts' JSON says which targets were met."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("bench_run", ROOT / "bench" / "run.py")
assert spec is not None and spec.loader is not None
bench_run = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench_run)


def test_missed_targets_are_the_checks_that_failed() -> None:
    result = {"checks": {"full within 1.05x of raw": True, "batch-1 step <= 1.5 ms": False, "capture <= 5 s": False}}
    assert bench_run.missed_targets(result) == ["batch-1 step <= 1.5 ms", "capture <= 5 s"]
    assert bench_run.missed_targets({"checks": {"a": True}}) == []
    assert bench_run.missed_targets(None) == []  # a script that wrote nothing states no target
