"""The backend-utils README's ``FastLauncher`` example runs as written on a CUDA device, through the C launcher (the
JIT call is never reached, its bound launch included), and a launch under launch hooks goes through the JIT call that
calls them. On CPU the same example runs under Triton's interpreter (``tests/backend/test_backend_utils_readme.py``)."""

from __future__ import annotations

import re
import runpy
from pathlib import Path
from unittest import mock

import pytest
import torch

pytest.importorskip(
    "triton", reason=("the launcher drives Triton kernels: pip install triton (CUDA builds of torch bring it)")
)

import triton

from cudagraph.backend_utils import FastLauncher

pytestmark = pytest.mark.gpu

README = Path(__file__).resolve().parents[3] / "packages" / "cudagraph-backend-utils" / "README.md"


def run_readme_example(folder: Path) -> dict[str, object]:
    """Run the example from a file of its own (Triton's JIT reads a kernel's source from the file it was defined in)
    and return its globals."""
    match = re.search(r"```python\n(import torch\nimport triton\n.*?FastLauncher.*?)```", README.read_text(), re.S)
    assert match is not None, "the backend-utils README lost its FastLauncher example"
    example = folder / "readme_fast_launcher.py"
    example.write_text(match.group(1))
    return runpy.run_path(str(example), run_name="readme_example")


def test_the_readme_example_runs_through_the_c_launcher(tmp_path: Path) -> None:
    jit_run = triton.runtime.jit.JITFunction.run

    def compile_only(self: object, *args: object, **kwargs: object) -> object:
        # ``warmup`` (compiling) goes through ``run`` too; a launch through the JIT call does not pass warmup=True.
        if not kwargs.get("warmup"):
            raise AssertionError("a launch went through the JIT call")
        return jit_run(self, *args, **kwargs)

    with mock.patch.object(triton.runtime.jit.JITFunction, "run", compile_only):
        namespace = run_readme_example(tmp_path)
        launcher = namespace["launch_scale"]
        assert isinstance(launcher, FastLauncher) and not launcher.jit_only
        # the bound launch calls the C entry point itself (direct_launch's native closure), not a Python launcher
        assert getattr(namespace["triple_x"], "__name__", None) == "launch_native"
        x, out = namespace["x"], namespace["out"]
        unaligned = x[1:]  # a new specialization: compiled once more, launched natively too
        launcher((triton.cdiv(unaligned.numel(), 1024),), (unaligned, out, unaligned.numel(), 3.0), {"BLOCK": 1024})
    torch.testing.assert_close(out[: unaligned.numel()], 3 * unaligned)


def test_with_a_launch_hook_set_the_launch_goes_through_the_jit_call_that_calls_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    namespace = run_readme_example(tmp_path)
    seen: list[object] = []
    monkeypatch.setattr(triton.knobs.runtime, "launch_enter_hook", seen.append)
    x, out = namespace["x"], namespace["out"]
    namespace["launch_scale"]((triton.cdiv(x.numel(), 1024),), (x, out, x.numel(), 5.0), {"BLOCK": 1024})
    torch.cuda.synchronize()
    assert len(seen) == 1
    torch.testing.assert_close(out, 5 * x)
