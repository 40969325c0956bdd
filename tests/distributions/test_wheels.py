"""Every distribution builds as a wheel, installs alone into a fresh venv with only its declared dependencies,
and imports there. Slow (torch goes into several venvs), so it runs once per session of the suite."""

from __future__ import annotations

import subprocess
import sys
import venv
from pathlib import Path

import pytest

from .workspace import load_distributions

DISTRIBUTIONS = load_distributions()


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """All workspace wheels, built once."""
    out = tmp_path_factory.mktemp("wheelhouse")
    directories = [str(dist.directory) for dist in DISTRIBUTIONS.values()]
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), *directories],
        check=True,
    )
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(DISTRIBUTIONS))
def test_wheel_installs_alone_and_imports(name: str, wheelhouse: Path, tmp_path: Path) -> None:
    dist = DISTRIBUTIONS[name]
    (wheel,) = wheelhouse.glob(f"{name.replace('-', '_')}-{dist.version}-*.whl")
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    # Torch first, from the pinned local CPU build, so the range in the wheel installs nothing more.
    if any(req.name == "torch" for req in dist.requirements) or name in {"cudagraph-runner", "cudagraph-engine"}:
        subprocess.run([str(python), "-m", "pip", "install", "-q", "torch==2.13.0"], check=True)
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--find-links", str(wheelhouse), str(wheel)],
        check=True,
    )
    installed = subprocess.run(
        [str(python), "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True, check=True
    ).stdout
    siblings = {line.split("==")[0] for line in installed.splitlines() if line.startswith("cudagraph-")}
    declared = {req.name for req in dist.requirements if req.name.startswith("cudagraph-")}
    assert siblings - {name} <= _transitive(declared), f"{name} pulled in undeclared siblings: {siblings}"
    result = subprocess.run(
        [str(python), "-c", f"import cudagraph.{dist.module} as m; print(m.__version__)"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == dist.version


def _transitive(names: set[str]) -> set[str]:
    seen: set[str] = set()
    stack = list(names)
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        stack.extend(req.name for req in DISTRIBUTIONS[name].requirements if req.name in DISTRIBUTIONS)
    return seen
