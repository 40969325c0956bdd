"""Programmatic dependent launch of the engine's Triton kernels (``kernels.triton.pdl``), without a GPU: the switch
and where it applies, and that it reaches every launch. ``pdl_probe.py`` records every launch the operations make
and compiles each for a Hopper GPU (sm_90): with PDL on, each kernel is compiled with Triton's ``launch_pdl`` and its
``PDL`` constexpr, waits on the grid dependency exactly once, writes nothing before the wait and reads before it only
where it prefetches weights (the GEMV's first tile, the norm's vector); with PDL off neither flag is set. The
kernels' numerics are the interpreter tests' (``PDL`` off there: the interpreter runs no CUDA instruction); the GPU
tests run them launched both ways (``tests/gpu/engine/test_gpu_triton_pdl.py``)."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed: pip install triton (CUDA builds of torch bring it)")

from cudagraph.backend_utils import FastLauncher
from cudagraph.engine.kernels.triton import decode_attention, extend_attention, lora, moe, ops, pdl

PROBE = Path(__file__).with_name("pdl_probe.py")
LAUNCHING_MODULES = (ops, decode_attention, extend_attention, lora, moe)
PREFETCHING_KERNELS = frozenset({"_gemv_kernel", "_rms_norm_kernel"})
"""Kernels that read weights before their wait (and only those may read anything there)."""


def package_kernels() -> dict[str, object]:
    """Every kernel a ``FastLauncher`` of the package launches, by name."""
    return {
        launcher.kernel.__name__
        if hasattr(launcher.kernel, "__name__")
        else launcher.kernel.fn.__name__: launcher.kernel
        for module in LAUNCHING_MODULES
        for launcher in vars(module).values()
        if isinstance(launcher, FastLauncher)
    }


def parameters(kernel: object) -> list[str]:
    function = getattr(kernel, "fn", kernel)
    return list(inspect.signature(function).parameters)


def test_every_kernel_of_the_package_takes_the_pdl_constexpr_last() -> None:
    kernels = package_kernels()
    assert len(kernels) == 10, sorted(kernels)
    for name, kernel in kernels.items():
        assert parameters(kernel)[-1] == "PDL", f"{name} takes no PDL constexpr last"


def run_probe(mode: str) -> list[dict[str, object]]:
    environment = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, str(PROBE), mode], capture_output=True, text=True, env=environment, timeout=900, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines()[1:]]


def test_with_pdl_on_every_launch_waits_once_before_it_writes_compiled_for_hopper() -> None:
    launches = run_probe("on")
    assert {launch["kernel"] for launch in launches} == set(package_kernels())
    for launch in launches:
        name = launch["kernel"]
        assert launch["launch_pdl"] and launch["pdl_constexpr"] and launch["compiled_launch_pdl"], launch
        assert launch["waits"] == 1 and launch["launch_dependents"] == 1, launch
        assert launch["writes_before_wait"] == 0, f"{name} writes before its grid-dependency wait"
        if name in PREFETCHING_KERNELS:
            assert launch["loads_before_wait"] > 0, f"{name} no longer prefetches its weights before the wait"
        else:
            assert launch["loads_before_wait"] == 0, f"{name} reads before its grid-dependency wait"


def test_with_pdl_off_no_launch_asks_for_it() -> None:
    launches = run_probe("off")
    assert {launch["kernel"] for launch in launches} == set(package_kernels())
    assert all(not launch["launch_pdl"] and not launch["pdl_constexpr"] for launch in launches), launches


def test_pdl_applies_to_cuda_devices_of_compute_capability_9_with_the_switch_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    capabilities = {0: (9, 0), 1: (8, 0)}
    monkeypatch.setattr(pdl, "triton_supports_pdl", lambda: True)
    monkeypatch.setattr(pdl, "_device_supports_pdl", lambda index: capabilities[index] >= (9, 0))
    monkeypatch.setattr(pdl, "_SWITCH", pdl._Switch(on=True))
    assert pdl.pdl_launch(torch.device("cuda", 0))
    assert not pdl.pdl_launch(torch.device("cuda", 1))
    assert not pdl.pdl_launch(torch.device("cpu"))
    with pdl.use_pdl(False):
        assert not pdl.pdl_enabled() and not pdl.pdl_launch(torch.device("cuda", 0))
        with pdl.use_pdl(True):
            assert pdl.pdl_launch(torch.device("cuda", 0))
        assert not pdl.pdl_enabled()
    assert pdl.pdl_enabled() and pdl.pdl_launch(torch.device("cuda", 0))
    monkeypatch.setattr(pdl, "triton_supports_pdl", lambda: False)
    assert not pdl.pdl_launch(torch.device("cuda", 0))


def test_triton_s_interpreter_never_launches_with_pdl() -> None:
    assert os.environ.get("TRITON_INTERPRET") == "1" or torch.cuda.is_available()
    if os.environ.get("TRITON_INTERPRET") == "1":
        assert not pdl.triton_supports_pdl()


# a fresh interpreter each: unset and "0" in `nox -s tests`, the other spellings `slow`
@pytest.mark.parametrize(
    ("value", "enabled"),
    [
        (None, True),
        ("0", False),
        *(pytest.param(*case, marks=pytest.mark.slow) for case in [("1", True), ("off", False), ("No", False)]),
    ],
)
def test_the_environment_variable_is_read_once_at_import(value: str | None, enabled: bool) -> None:
    environment = {key: item for key, item in os.environ.items() if key != pdl.PDL_ENV}
    if value is not None:
        environment[pdl.PDL_ENV] = value
    code = (
        "import os\n"
        "from cudagraph.engine.kernels.triton import pdl\n"
        "first = pdl.pdl_enabled()\n"
        f"os.environ[{pdl.PDL_ENV!r}] = {'1' if not enabled else '0'!r}\n"
        "print(first, pdl.pdl_enabled())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment, check=True)
    assert done.stdout.split() == [str(enabled), str(enabled)]
