"""Run the GPU tests with the current interpreter, no venv and no network (what ``nox -s gpu`` calls).

The workspace sources go on ``PYTHONPATH`` (``cudagraph`` is a PEP 420 namespace, so every ``src/`` directory
contributes), and wheels carried in ``.whl/`` (flashinfer and its needs) are unpacked into ``.site/`` first.
Extra arguments go to pytest, e.g. ``python3 tests/gpu/run.py -k breakable``.
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


def main(argv: list[str]) -> int:
    """Run ``pytest -m gpu`` over tests/gpu/ with the workspace importable; return pytest's exit status.

    On a machine that cannot run them (no torch, no CUDA) say why in one line and succeed: there is nothing to run.
    """
    reason = unavailable_reason()
    if reason is not None:
        print(f"GPU tests skipped: {reason}")
        return 0
    paths_given = any(not arg.startswith("-") and (ROOT / arg.split("::")[0]).exists() for arg in argv)
    targets = [] if paths_given else [str(ROOT / "tests" / "gpu")]
    command = [sys.executable, "-m", "pytest", "-m", "gpu", "-p", "no:cacheprovider", "-rsx", *targets, *argv]
    return subprocess.call(command, env=workspace_env(), cwd=ROOT)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
