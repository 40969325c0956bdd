"""The cudagraph-runner README's routing example runs as written and prints the table it shows."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "packages" / "cudagraph-runner" / "README.md"


def test_the_routing_example_runs_and_prints_its_table() -> None:
    text = README.read_text()
    match = re.search(r"```python\n((?:(?!```).)*)```\n\nprints\n\n```\n(.*?)```", text, re.S)
    assert match is not None, "the runner README lost its routing example and the table it prints"
    example, shown = match.groups()
    assert "runner.route(" in example and "metrics.table()" in example
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(example, str(README), "exec"), {"__name__": "runner_readme_example"})
    assert printed.getvalue() == shown
