"""Sessions for the cudagraph monorepo.

``nox -s tests`` (the default) and ``nox -s migrate`` are the two commands a fresh machine needs. Both build their own
virtualenv; ``build`` and ``packaging`` build the distributions and install each one alone, as a user would. Torch is
installed with pip as the pinned CPU build (``TORCH_CPU``) because pip finds that wheel on the local disk, while uv
would download a multi-GB CUDA build. ``gpu`` and ``bench`` run on a CUDA machine with no network: they use the
interpreter that already has torch and put the workspace sources on ``PYTHONPATH`` instead of installing.
"""

from __future__ import annotations

import os
from pathlib import Path

import nox

ROOT = Path(__file__).parent
TORCH_CPU = "torch==2.13.0"
# Dependency order: each package only needs those before it.
WORKSPACE_PACKAGES = (
    "packages/cudagraph-config",
    "packages/cudagraph-backend-utils",
    "packages/cudagraph-backend",
    "packages/cudagraph-runner",
    "packages/cudagraph-engine",
    "codemods",
    "shims",
)
# transformers is the reference forward nobody here wrote (compared against on CPU in float32); triton runs the
# Triton kernel set's tests on CPU tensors through its interpreter (CUDA builds of torch bring it themselves).
DIST = ROOT / "dist"
TEST_REQUIREMENTS = (
    "pytest>=8",
    "hypothesis>=6.100",
    "packaging>=23",
    "tqdm>=4.60",
    "transformers>=4.50",
    "triton>=3.2; sys_platform == 'linux' and platform_machine == 'x86_64'",
)

nox.options.sessions = ["tests"]
nox.options.default_venv_backend = "virtualenv"


def install_workspace(session: nox.Session, *extra: str) -> None:
    """Install torch (CPU build unless one is present), every workspace package editable, and ``extra``."""
    session.install(TORCH_CPU)
    editable = [arg for package in WORKSPACE_PACKAGES for arg in ("-e", package)]
    session.install(*editable, *extra)


@nox.session(venv_backend="virtualenv")
def tests(session: nox.Session) -> None:
    """Unit, property, codemod, shim and packaging tests on the CPU; GPU tests skip with a reason.

    First the real trees the codemods are proven on (released SGLang sources) are fetched into a cache; offline that
    step says so and their tests skip with the reason.
    """
    install_workspace(session, *TEST_REQUIREMENTS)
    session.run("python", "tests/realtrees/trees.py", "fetch")
    session.run("pytest", *(session.posargs or ["-q"]))


@nox.session(venv_backend="virtualenv")
def property(session: nox.Session) -> None:
    """Hypothesis property tests only; ``nox -s property -- --hypothesis-profile=deep`` searches much longer."""
    install_workspace(session, *TEST_REQUIREMENTS)
    session.run("pytest", "tests/property", *(session.posargs or ["-q"]))


@nox.session(venv_backend="virtualenv")
def lint(session: nox.Session) -> None:
    """Ruff (lint and format check) over the tree and mypy over the packages."""
    install_workspace(session, "ruff>=0.6", "mypy>=1.10")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    sources = [str(Path(package, "src")) for package in WORKSPACE_PACKAGES]
    session.run("mypy", *sources, env={"MYPYPATH": os.pathsep.join(sources)})


@nox.session(venv_backend="none")
def gpu(session: nox.Session) -> None:
    """GPU tests with the current interpreter (no venv, no network): ``pytest -m gpu`` via tests/gpu/run.py."""
    session.run("python3", "tests/gpu/run.py", *session.posargs, external=True)


@nox.session(venv_backend="none")
def bench(session: nox.Session) -> None:
    """The benchmark harness with the current interpreter (``bench/run.py``): a table on stdout, JSON and plots in
    ``bench/results/``. ``nox -s bench -- --quick`` for a smoke run, ``-- --check`` to fail on a missed target,
    ``-- compare OLD.json NEW.json`` to flag ratios more than 10 % worse."""
    session.run("python3", "bench/run.py", *session.posargs, external=True)


@nox.session(venv_backend="virtualenv")
def migrate(session: nox.Session) -> None:
    """Migrate PATH... in place (``nox -s migrate -- PATH``); with no path, migrate the bundled legacy example.

    The example's result stays in ``./cudagraph-migrate-example`` at the repository root (git-ignored): the migrated
    copy and ``migration.patch``, both paths printed; a re-run replaces them.
    """
    install_workspace(session, "pytest>=8")
    if session.posargs:
        # relative paths are the caller's, not the noxfile's folder (nox runs sessions from there)
        session.chdir(session.invoked_from)
        session.run("cudagraph-migrate", *session.posargs)
    else:
        # from the repository root, whatever folder nox was invoked from, so the result lands in the ignored folder
        session.chdir(ROOT)
        session.run("python", "-m", "cudagraph.migrate.example")


def build_distributions(session: nox.Session) -> None:
    """An sdist and a wheel of every distribution in ``dist/``, each wheel built from its sdist (as an index does)."""
    session.install("build>=1.2")
    for artifact in DIST.glob("cudagraph_*"):
        artifact.unlink()
    for package in WORKSPACE_PACKAGES:
        # `python -m build` with no target builds the sdist, then the wheel from the unpacked sdist
        session.run("python", "-m", "build", "--outdir", str(DIST), package, silent=True)
    session.log(f"built {len(list(DIST.glob('cudagraph_*.whl')))} wheels and sdists into {DIST}")


@nox.session(venv_backend="virtualenv")
def build(session: nox.Session) -> None:
    """Build an sdist and a wheel of every distribution into ``dist/`` (each wheel from its sdist)."""
    build_distributions(session)


@nox.session(venv_backend="virtualenv")
def packaging(session: nox.Session) -> None:
    """Build ``dist/``, then install each distribution alone into a fresh venv: imports, ``--help``, declared deps.

    ``nox -s packaging -- cudagraph-runner`` checks one; see ``tests/distributions/alone.py`` for what is checked.
    """
    build_distributions(session)
    session.install("packaging>=23")
    session.run("python", "-m", "tests.distributions.alone", "--torch", TORCH_CPU, *session.posargs)
