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


def test_the_lifecycle_example_runs_after_the_routing_example_and_prints_what_its_comments_say() -> None:
    text = README.read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    routing = next(block for block in blocks if "metrics.table()" in block)
    lifecycle = next(block for block in blocks if "capture_policy=CapturePolicy.LAZY" in block)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        namespace = {"__name__": "runner_readme_example"}
        exec(compile(routing, str(README), "exec"), namespace)
        start = len(printed.getvalue())
        exec(compile(lifecycle, str(README), "exec"), namespace)
    expected = [line.split("  # ", 1)[1] for line in lifecycle.splitlines() if line.startswith("print(")]
    assert len(expected) == 6
    assert printed.getvalue()[start:].splitlines() == expected


def test_the_drafting_example_runs_and_its_assert_holds() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    drafting = next(block for block in blocks if "DraftCudaGraphRunner(" in block)
    namespace: dict[str, object] = {"__name__": "runner_readme_example"}
    exec(compile(drafting, str(README), "exec"), namespace)
    assert namespace["tokens"].shape == (3, 3)  # type: ignore[attr-defined]
