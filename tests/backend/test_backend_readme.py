"""The cudagraph-backend README's CPU examples (``PiecewiseCompiler`` on its own, custom ops' inductor fallbacks) run
as written."""

from __future__ import annotations

import re
from pathlib import Path

import torch._dynamo

README = Path(__file__).resolve().parents[2] / "packages" / "cudagraph-backend" / "README.md"


def test_the_piecewise_compiler_example_runs() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    example = next((block for block in blocks if "PiecewiseCompiler(" in block), None)
    assert example is not None, "the backend README lost its PiecewiseCompiler example"
    torch._dynamo.reset()
    try:
        exec(compile(example, str(README), "exec"), {"__name__": "backend_readme_example"})
    finally:
        torch._dynamo.reset()


def test_the_inductor_fallback_example_runs() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    example = next((block for block in blocks if "register_inductor_fallbacks(" in block), None)
    assert example is not None, "the backend README lost its inductor fallback example"
    exec(compile(example, str(README), "exec"), {"__name__": "backend_readme_fallback_example"})
