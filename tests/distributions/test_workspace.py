"""Fast checks of the package boundaries: versions, metadata, sibling ranges, namespace, import direction.

The slow check (build every sdist and wheel, install each distribution alone, import everything) is
``nox -s packaging`` (``tests/distributions/alone.py``), which CI runs after the tests.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys

import pytest
from packaging.utils import canonicalize_name
from packaging.version import Version

from .workspace import ROOT, dunder_versions, load_distributions

# The Pythons the distributions declare and CI runs: the noxfile's PYTHONS, read without importing nox.
PYTHONS = next(
    ast.literal_eval(node.value)
    for node in ast.parse((ROOT / "noxfile.py").read_text()).body
    if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "PYTHONS"
)

DISTRIBUTIONS = load_distributions()
MODULE_TO_DISTRIBUTION = {dist.module: name for name, dist in DISTRIBUTIONS.items()}


@pytest.mark.parametrize("name", sorted(DISTRIBUTIONS))
def test_sibling_ranges_admit_current_versions(name: str) -> None:
    for requirement in DISTRIBUTIONS[name].requirements:
        sibling = DISTRIBUTIONS.get(requirement.name)
        if sibling is None:
            continue
        assert requirement.specifier.contains(sibling.version, prereleases=True), (
            f"{name} requires {requirement}, but {sibling.name} is at {sibling.version}"
        )


def _replay_checked_torch_versions() -> tuple[str, ...]:
    """``CHECKED_REPLAY_TORCH_VERSIONS`` of the bound graph replay, read with ``ast`` (this module imports no torch)."""
    path = DISTRIBUTIONS["cudagraph-backend-utils"].source / "replay.py"
    return next(
        ast.literal_eval(node.value)
        for node in ast.parse(path.read_text()).body
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "CHECKED_REPLAY_TORCH_VERSIONS"
    )


@pytest.mark.parametrize("name", sorted(DISTRIBUTIONS))
def test_torch_range_admits_the_ci_and_device_builds(name: str) -> None:
    """The torch range is the one the private replay bind was checked in: it admits the CI and device builds and
    stops before the first minor release after the newest checked one (a newer torch falls back to the public
    replay at run time; the metadata says what was checked)."""
    newest = max(Version(version) for version in _replay_checked_torch_versions())
    first_unchecked = f"{newest.major}.{newest.minor + 1}.0"
    for requirement in DISTRIBUTIONS[name].requirements:
        if requirement.name == "torch":
            for version in ("2.11.0", "2.13.0", str(newest)):
                assert requirement.specifier.contains(version), f"{name}: {requirement} rejects torch {version}"
            assert {spec.operator for spec in requirement.specifier} == {">=", "<"}, "torch is bounded both ways"
            assert not requirement.specifier.contains(first_unchecked), (
                f"{name}: {requirement} admits torch {first_unchecked}, whose CUDAGraph.replay nobody checked"
            )


@pytest.mark.parametrize("name", sorted(DISTRIBUTIONS))
def test_version_has_one_source(name: str) -> None:
    """Hatch reads the version from the package's literal ``__version__``; pyproject.toml repeats it nowhere."""
    dist = DISTRIBUTIONS[name]
    project = dist.pyproject["project"]
    assert "version" not in project and "version" in project.get("dynamic", [])
    init = dist.source / "__init__.py"
    assert dist.directory / dist.pyproject["tool"]["hatch"]["version"]["path"] == init
    assert dunder_versions(init) == [dist.version]
    assert str(Version(dist.version)) == dist.version, "not a normalized PEP 440 version"
    assert f"\n## {name} {dist.version}\n" in (ROOT / "CHANGELOG.md").read_text(), "no CHANGELOG section"


@pytest.mark.parametrize("name", sorted(DISTRIBUTIONS))
def test_metadata_a_wheel_needs(name: str) -> None:
    """LICENSE (the repository's), README, classifiers and Requires-Python, the same in all seven; no project URLs
    until the repository has a public home (README, "Where it lives"), never a placeholder."""
    dist = DISTRIBUTIONS[name]
    project = dist.pyproject["project"]
    assert project["license"] == "MIT" and project["license-files"] == ["LICENSE"]
    assert (dist.directory / "LICENSE").read_text() == (ROOT / "LICENSE").read_text()
    assert (dist.directory / project["readme"]).read_text().startswith(f"# {name}\n")
    assert project["requires-python"] == ">=3.10"
    assert "Typing :: Typed" in project["classifiers"] and (dist.source / "py.typed").is_file()
    assert not [c for c in project["classifiers"] if c.startswith("License ::")], "license expression says it"
    assert [c for c in project["classifiers"] if c.startswith("Programming Language :: Python :: 3.")] == [
        f"Programming Language :: Python :: {version}" for version in PYTHONS
    ], "the classifiers name the Pythons CI runs (PYTHONS in noxfile.py)"
    assert "urls" not in project, "no public repository yet: README, 'Where it lives', says when to add the URLs"


@pytest.mark.parametrize("name", sorted(DISTRIBUTIONS))
def test_sdist_holds_what_the_wheel_includes(name: str) -> None:
    """A wheel is built from the sdist, so it may force-include nothing from outside the project directory."""
    targets = DISTRIBUTIONS[name].pyproject["tool"]["hatch"]["build"]["targets"]
    outside = [src for src in targets.get("wheel", {}).get("force-include", {}) if src.startswith("..")]
    assert outside == []


def test_sdist_carries_the_rename_table_where_the_reader_looks() -> None:
    from cudagraph.config.renames import PACKAGED_RENAMES_PATH

    config = DISTRIBUTIONS["cudagraph-config"]
    force_include = config.pyproject["tool"]["hatch"]["build"]["targets"]["sdist"]["force-include"]
    assert (config.directory / "../../refactor/renames.toml").resolve() == ROOT / "refactor" / "renames.toml"
    packaged = PACKAGED_RENAMES_PATH.relative_to(PACKAGED_RENAMES_PATH.parents[3])
    assert force_include == {"../../refactor/renames.toml": f"src/{packaged.as_posix()}"}


def test_sdist_carries_the_migration_guide_where_explain_looks() -> None:
    from cudagraph.migrate.guide import PACKAGED_GUIDE_PATH

    migrate = DISTRIBUTIONS["cudagraph-migrate"]
    force_include = migrate.pyproject["tool"]["hatch"]["build"]["targets"]["sdist"]["force-include"]
    assert (migrate.directory / "../refactor/migration-guide.md").resolve() == ROOT / "refactor" / "migration-guide.md"
    packaged = PACKAGED_GUIDE_PATH.relative_to(PACKAGED_GUIDE_PATH.parents[3])
    assert force_include == {"../refactor/migration-guide.md": f"src/{packaged.as_posix()}"}


def _closure(name: str, extras: tuple[str, ...] = ()) -> set[str]:
    """Every distribution name ``name`` installs (itself included), following workspace siblings."""
    seen: set[str] = set()
    stack = [(name, extras)]
    while stack:
        current, wanted = stack.pop()
        if current in seen:
            continue
        seen.add(current)
        dist = DISTRIBUTIONS.get(current)
        if dist is None:
            continue
        requirements = [*dist.requirements, *(req for extra in wanted for req in dist.extras[extra])]
        stack.extend((canonicalize_name(req.name), ()) for req in requirements)
    return seen


def test_legacy_pulls_neither_libcst_nor_pyyaml() -> None:
    assert not _closure("cudagraph-legacy") & {"libcst", "pyyaml"}


def test_engine_offers_the_flashinfer_extra() -> None:
    assert "flashinfer-python" in _closure("cudagraph-engine", ("flashinfer",))
    assert "flashinfer-python" not in _closure("cudagraph-engine")


def test_namespace_has_no_init() -> None:
    offenders = [str(p.relative_to(ROOT)) for p in ROOT.glob("*/**/src/cudagraph/__init__.py")]
    assert offenders == []


def _imported_cudagraph_modules(path) -> set[str]:
    """Top-level ``cudagraph.X`` package names (and private ``cudagraph.X._y`` paths) a source file imports."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        found.update(name for name in names if name.startswith("cudagraph."))
    return found


@pytest.mark.parametrize("name", sorted(DISTRIBUTIONS))
def test_imports_follow_declared_dependencies(name: str) -> None:
    """A package imports only itself and siblings it declares, and never a sibling's ``_private`` module."""
    dist = DISTRIBUTIONS[name]
    declared = {req.name for req in dist.requirements}
    problems = []
    for path in dist.source.rglob("*.py"):
        for module in _imported_cudagraph_modules(path):
            parts = module.split(".")
            target = MODULE_TO_DISTRIBUTION.get(parts[1])
            if target is None:
                problems.append(f"{path.relative_to(ROOT)} imports unknown {module}")
            elif target != name and target not in declared:
                problems.append(f"{path.relative_to(ROOT)} imports {module} but {name} does not depend on {target}")
            elif target != name and any(part.startswith("_") for part in parts[2:]):
                problems.append(f"{path.relative_to(ROOT)} reaches into private {module}")
    assert problems == []


# Imports of a ``cudagraph.config`` module past its top level that another package still makes, each with why. The
# test below fails when one of these is no longer made, so the list only shrinks.
_CONFIG_MODULE_IMPORTS_KEPT = {
    # The codemods re-export the rename table's reader for their callers, with two names (the packaged table's path
    # and the schema version) that ``cudagraph.config`` does not export.
    ("cudagraph-migrate", "cudagraph.config.renames"),
}


@pytest.mark.parametrize("name", sorted(name for name, dist in DISTRIBUTIONS.items() if dist.module != "config"))
def test_other_packages_import_only_the_config_packages_public_names(name: str) -> None:
    """``cudagraph.config`` is read through its top level (``__all__``): its modules are its own to move and rename,
    like a ``_private`` module of any other sibling."""
    reached = {
        (name, module, str(path.relative_to(ROOT)))
        for path in DISTRIBUTIONS[name].source.rglob("*.py")
        for module in _imported_cudagraph_modules(path)
        if module.startswith("cudagraph.config.")
    }
    kept = {(dist, module) for dist, module in _CONFIG_MODULE_IMPORTS_KEPT if dist == name}
    assert sorted(where for dist, module, where in reached if (dist, module) not in kept) == [], (
        "import these names from cudagraph.config (export them there if they are missing)"
    )
    assert kept <= {(dist, module) for dist, module, _ in reached}, "an exception above is no longer needed"


@pytest.mark.parametrize("module", ["cudagraph.config", "cudagraph.migrate"])
def test_imports_without_torch(module: str) -> None:
    code = f"import sys; sys.modules['torch'] = None; import {module}; print('ok')"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_the_github_matrices_run_the_declared_pythons() -> None:
    """Every ``python:`` matrix in the CI workflow lists exactly the Pythons the distributions declare."""
    workflow = (ROOT / ".github" / "workflows" / "ci.yml").read_text()
    matrices = re.findall(r"^\s+python: \[(.*)\]$", workflow, re.M)
    assert matrices, "ci.yml lost its python matrices"
    for matrix in matrices:
        assert [version.strip().strip('"') for version in matrix.split(",")] == list(PYTHONS)
