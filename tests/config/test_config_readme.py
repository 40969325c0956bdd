"""The package README's examples run as written: its Python blocks, and its shell commands of the config CLI."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "packages" / "cudagraph-config" / "README.md"


BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)

# A line each example prints (what its reader is told to look at).
PRINTED = [
    "json --cuda-graph-mode",
    "max_padding_ratio 1.5 sends 5, 9..10, 17..42 eagerly (29 sizes)",
]


def test_every_example_has_its_printed_line() -> None:
    assert len(BLOCKS) == len(PRINTED)


@pytest.mark.parametrize(("block", "printed"), list(zip(BLOCKS, PRINTED, strict=False)), ids=["usage", "graph sizing"])
def test_readme_example_runs(block: str, printed: str, capsys: pytest.CaptureFixture[str]) -> None:
    exec(compile(block, str(README), "exec"), {})
    assert printed in capsys.readouterr().out


COMMANDS = [
    " ".join(command.replace("\\\n", " ").split())
    for block in re.findall(r"```sh\n(.*?)```", README.read_text(), flags=re.DOTALL)
    for command in re.split(r"(?<!\\)\n", block.strip())
    if command.startswith("python -m cudagraph.config ")
]


def test_the_shell_examples_are_found() -> None:
    assert len(COMMANDS) >= 2


@pytest.mark.parametrize("command", COMMANDS)
def test_shell_example_runs(command: str) -> None:
    argv = [sys.executable, *shlex.split(command)[1:]]
    result = subprocess.run(argv, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "decode.captures" in result.stdout  # each one asks for --explain
