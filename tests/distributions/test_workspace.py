"""Fast checks of the package boundaries: versions, sibling ranges, namespace, import direction."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest

from .workspace import ROOT, load_distributions

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


@pytest.mark.parametrize("name", sorted(DISTRIBUTIONS))
def test_torch_range_admits_the_ci_and_device_builds(name: str) -> None:
    for requirement in DISTRIBUTIONS[name].requirements:
        if requirement.name == "torch":
            for version in ("2.11.0", "2.13.0"):
                assert requirement.specifier.contains(version), f"{name}: {requirement} rejects torch {version}"


@pytest.mark.parametrize("name", sorted(DISTRIBUTIONS))
def test_dunder_version_matches_pyproject(name: str) -> None:
    dist = DISTRIBUTIONS[name]
    tree = ast.parse((dist.source / "__init__.py").read_text())
    versions = [
        node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets)
        and isinstance(node.value, ast.Constant)
    ]
    assert versions == [dist.version]


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


@pytest.mark.parametrize("module", ["cudagraph.config", "cudagraph.migrate"])
def test_imports_without_torch(module: str) -> None:
    code = f"import sys; sys.modules['torch'] = None; import {module}; print('ok')"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
