"""The README's example runs as written."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_example_runs() -> None:
    match = re.search(r"## Example\n\n```python\n(.*?)```", README.read_text(), re.S)
    assert match is not None, "README.md lost its ## Example python block"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(compile(match.group(1), str(README), "exec"), {"__name__": "readme_example"})
    assert any("disable-piecewise-cuda-graph" in str(w.message) for w in caught)


def test_readme_shows_the_two_commands() -> None:
    text = README.read_text()
    assert "nox -s migrate" in text and "nox -s tests" in text
    ci = (README.parent / ".ci" / "run").read_text()
    command = next(
        line for line in text.splitlines() if line.endswith("# the tests (CPU; GPU tests skip with a reason)")
    )
    assert command.split("#")[0].strip() in ci
