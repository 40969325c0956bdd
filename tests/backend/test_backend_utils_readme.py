"""The cudagraph-backend-utils README's bound-launch example runs as written (on CPU through Triton's interpreter, on a
CUDA device natively: ``tests/gpu/engine/test_gpu_triton_launch.py`` checks that it skips the JIT call there), and
``triton_launch``'s docstring carries the same example."""

from __future__ import annotations

import os
import re
import runpy
import textwrap
from pathlib import Path

import pytest
import torch

pytest.importorskip(
    "triton", reason="the example launches a Triton kernel: pip install triton (CUDA builds of torch bring it)"
)

from cudagraph.backend_utils import FastLauncher, triton_launch

README = Path(__file__).resolve().parents[2] / "packages" / "cudagraph-backend-utils" / "README.md"


def readme_example() -> str:
    match = re.search(r"```python\n(import torch\nimport triton\n.*?FastLauncher.*?)```", README.read_text(), re.S)
    assert match is not None, "the backend-utils README lost its FastLauncher example"
    return match.group(1)


def test_the_module_docstring_carries_the_readme_example() -> None:
    docstring = triton_launch.__doc__ or ""
    assert "Example" in docstring
    assert textwrap.indent(readme_example(), "    ").strip() in docstring, (
        "the README's and triton_launch's examples differ: keep one example in both"
    )


def test_the_readme_example_runs(tmp_path: Path) -> None:
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip(
            "no CUDA device and Triton's interpreter is off: run under `nox -s tests` (tests/conftest.py sets "
            "TRITON_INTERPRET=1 without a GPU) or `nox -s gpu` on a CUDA machine"
        )
    # From a file of its own: Triton reads a kernel's source from the file it was defined in.
    example = tmp_path / "readme_bound_launch.py"
    example.write_text(readme_example())
    namespace = runpy.run_path(str(example), run_name="readme_example")
    launcher = namespace["launch_scale"]
    assert isinstance(launcher, FastLauncher)
    if not torch.cuda.is_available():
        assert launcher.jit_only, "under the interpreter every launch goes through the JIT call"
    torch.testing.assert_close(namespace["out"], 3 * namespace["x"])
