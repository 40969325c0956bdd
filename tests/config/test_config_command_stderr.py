"""``python -m cudagraph.config resolve`` says everything on stderr in one format: ``warning: ...``."""

from __future__ import annotations

import subprocess
import sys


def test_warnings_and_log_records_share_one_format() -> None:
    argv = ["--disable-cuda-graph", "--decode-cuda-graph-backend", "breakable"]
    result = subprocess.run(
        [sys.executable, "-m", "cudagraph.config", "resolve", *argv], capture_output=True, text=True, check=True
    )
    lines = result.stderr.splitlines()
    assert any("is deprecated" in line for line in lines)  # a Python warning
    assert any("overrides --disable-cuda-graph" in line for line in lines)  # a log record
    assert lines and all(line.startswith("warning: ") for line in lines), result.stderr
