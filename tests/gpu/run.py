"""Run the GPU tests with the current interpreter, no venv and no network (what ``nox -s gpu`` calls).

The workspace sources go on ``PYTHONPATH`` (``cudagraph`` is a PEP 420 namespace, so every ``src/`` directory
contributes), and wheels carried in ``.whl/`` (flashinfer and its needs) are unpacked into ``.site/`` first.
Extra arguments go to pytest, e.g. ``python3 tests/gpu/run.py -k breakable``.

Before pytest starts, FlashInfer's JIT kernels that the tensor-parallel file's FlashInfer cases use are built once
(``tests/gpu/flashinfer_warmup.py``, in a process of its own) when the selection reaches that file, so that no test
spends minutes compiling on every rank; ``--no-flashinfer-warmup`` skips that step, ``--flashinfer-warmup-only``
runs it alone (a call of its own before the tests, on a machine that keeps FlashInfer's cache between calls).
Without flashinfer it says so in one line and the tests run.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE_DIRS = [*sorted(ROOT.glob("packages/*/src")), ROOT / "codemods/src", ROOT / "shims/src"]
FLASHINFER_WARMUP = Path(__file__).resolve().with_name("flashinfer_warmup.py")
TENSOR_PARALLEL_FILE = ROOT / "tests" / "gpu" / "engine" / "test_gpu_engine_tensor_parallel.py"
"""The file whose FlashInfer cases the warm-up builds for."""
NO_WARMUP = "--no-flashinfer-warmup"
WARMUP_ONLY = "--flashinfer-warmup-only"


def workspace_env() -> dict[str, str]:
    """Environment with the workspace sources (and carried wheels, if any) importable."""
    paths = [str(path) for path in SOURCE_DIRS]
    wheels = sorted(glob.glob(str(ROOT / ".whl" / "*.whl")))
    if wheels:
        site = ROOT / ".site"
        install_wheels(wheels, site)
        paths.append(str(site))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*paths, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def install_wheels(wheels: list[str], site: Path) -> None:
    """Unpack ``wheels`` into ``site`` unless the same wheels already are there (a stamp of their names and sizes):
    several runs started side by side must not reinstall files another one is importing."""
    stamp = site / ".installed-wheels"
    wanted = "\n".join(f"{Path(wheel).name} {Path(wheel).stat().st_size}" for wheel in wheels)
    if stamp.is_file() and stamp.read_text() == wanted:
        return
    command = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--upgrade"]
    subprocess.run([*command, "--target", str(site), *wheels], check=True)
    stamp.write_text(wanted)


def unavailable_reason() -> str | None:
    """Why this interpreter cannot run GPU work (no torch, or no CUDA device), or None when it can."""
    if importlib.util.find_spec("torch") is None:
        return f"torch is not installed for {sys.executable}"
    import torch

    if not torch.cuda.is_available():
        return f"CUDA is not available (torch {torch.__version__}, {torch.cuda.device_count()} devices)"
    return None


OPTIONS_WITH_A_VALUE = frozenset({"--ignore", "--ignore-glob", "--deselect", "-k", "-m", "-p", "-c", "--rootdir"})
"""pytest options whose value may follow as the next argument (never a test path)."""


def _split_arguments(argv: list[str]) -> tuple[list[Path], list[Path]]:
    """The test paths among pytest's arguments (``path`` or ``path::test``) and the ``--ignore``d ones, absolute."""
    paths: list[Path] = []
    ignored: list[Path] = []
    option = None
    for arg in argv:
        if option is not None:
            if option == "--ignore":
                ignored.append((ROOT / arg).resolve())
            option = None
        elif arg in OPTIONS_WITH_A_VALUE:
            option = arg
        elif arg.startswith("--ignore="):
            ignored.append((ROOT / arg.split("=", 1)[1]).resolve())
        elif not arg.startswith("-") and (ROOT / arg.split("::")[0]).exists():
            paths.append((ROOT / arg.split("::")[0]).resolve())
    return paths, ignored


def _covers(path: Path, target: Path) -> bool:
    return path == target or path in target.parents


def reaches_tensor_parallel_file(argv: list[str]) -> bool:
    """Whether pytest run with ``argv`` collects the tensor-parallel file: no path given (all of tests/gpu), or a
    path that is that file or a folder above it, and no ``--ignore`` of either."""
    paths, ignored = _split_arguments(argv)
    if any(_covers(path, TENSOR_PARALLEL_FILE) for path in ignored):
        return False
    return any(_covers(path, TENSOR_PARALLEL_FILE) for path in paths or [ROOT / "tests" / "gpu"])


def warm_flashinfer(env: dict[str, str]) -> int:
    """Build the FlashInfer kernels the tensor-parallel file uses (``flashinfer_warmup.py``); its exit status."""
    return subprocess.call([sys.executable, str(FLASHINFER_WARMUP)], env=env, cwd=ROOT)


def main(argv: list[str]) -> int:
    """Run ``pytest -m gpu`` over tests/gpu/ with the workspace importable, after FlashInfer's warm-up when the
    selection reaches the tensor-parallel file; return pytest's exit status (the warm-up's with
    ``--flashinfer-warmup-only``).

    On a machine that cannot run them (no torch, no CUDA) say why in one line and succeed: there is nothing to run.
    """
    warm_only, no_warmup = WARMUP_ONLY in argv, NO_WARMUP in argv
    argv = [arg for arg in argv if arg not in (WARMUP_ONLY, NO_WARMUP)]
    reason = unavailable_reason()
    if reason is not None:
        print(f"GPU tests skipped: {reason}")
        return 0
    env = workspace_env()
    if warm_only:
        return warm_flashinfer(env)
    if not no_warmup and reaches_tensor_parallel_file(argv):
        warm_flashinfer(env)  # a failure is reported there; the tests build what they need
    targets = [] if _split_arguments(argv)[0] else [str(ROOT / "tests" / "gpu")]
    command = [sys.executable, "-m", "pytest", "-m", "gpu", "-p", "no:cacheprovider", "-rsx", *targets, *argv]
    return subprocess.call(command, env=env, cwd=ROOT)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
