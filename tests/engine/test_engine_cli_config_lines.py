"""The config's warnings reach a command-line user as log lines; Python callers of ``resolve`` still get warnings."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import warnings

import pytest

from cudagraph.config import ConfigError, Environment, LegacyFlagWarning, OverriddenSettingWarning, resolve
from cudagraph.engine.config_lines import held_config_lines

LOG_LINE = re.compile(r"^\[[^]]+\] (DEBUG|INFO|WARNING|ERROR) cudagraph\.[\w.]+: ")
"""The engine's log format (``commands.LOG_FORMAT``)."""

LEGACY_AND_OVERRIDE = ["--disable-cuda-graph", "--decode-cuda-graph-backend", "full"]


def test_config_warnings_are_log_lines_on_the_command_line() -> None:
    command = [sys.executable, "-m", "cudagraph.engine", "generate", "--preset", "tiny-qwen3-random"]
    command += ["--prompt-token-ids", "1,2", "--max-new-tokens", "1", "--device", "cpu", *LEGACY_AND_OVERRIDE]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert all(LOG_LINE.match(line) for line in lines), result.stderr
    # The two Python warnings resolve raises (LegacyFlagWarning, OverriddenSettingWarning), one log line each.
    config_warnings = [line.split(": ", 1)[1] for line in lines if " WARNING cudagraph.config: " in line]
    assert len([line for line in config_warnings if line.startswith("--disable-cuda-graph ")]) == 1, result.stderr
    assert "decode.backend: --decode-cuda-graph-backend 'full' overrides --disable-cuda-graph 'disabled'" in (
        config_warnings
    )
    assert "resolve(" not in result.stderr and "Warning:" not in result.stderr


def test_python_callers_still_get_the_warning_categories() -> None:
    with pytest.warns(LegacyFlagWarning), pytest.warns(OverriddenSettingWarning):
        resolve(disable_cuda_graph=True, decode_cuda_graph_backend="full")


def test_held_lines_wait_for_release_and_keep_their_order(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO), warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning that escaped the block would fail the test
        with held_config_lines() as held:
            resolve(disable_piecewise_cuda_graph=True, environment=Environment(device_type="cpu"))
        assert caplog.records == []
        held.release()
        held.release()  # a second release emits nothing again
    records = [(record.name, record.levelname, record.getMessage()) for record in caplog.records]
    assert [level for _, level, _ in records] == ["INFO", "WARNING"], records
    assert records[0][0].startswith("cudagraph.config") and "non_cuda_device" in records[0][2]
    assert records[1][0] == "cudagraph.config" and "--disable-piecewise-cuda-graph" in records[1][2]


def test_a_failed_resolution_holds_nothing(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO), pytest.raises(ConfigError, match="fastest"), held_config_lines():
        resolve(decode_cuda_graph_backend="fastest")
    assert caplog.records == []
