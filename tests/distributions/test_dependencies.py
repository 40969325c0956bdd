"""Each distribution declares exactly what its source imports: no import of a distribution it does not declare, no
declared distribution that nothing imports, and no module-level import of an extra's distribution on the way of a
plain ``import cudagraph.X`` (or a console script).

Read from the sources with ``ast``, nothing imported, so it runs without torch. Every import counts, wherever it
stands (module level, inside a function, under ``try``): a lazy import is still a dependency, declared as a
requirement or as an extra. The few declarations no import shows are listed in ``DECLARED_NOT_IMPORTED`` with the
reason; imports made by name from a table (the shims) are in ``dynamic_imports``. ``nox -s packaging``
(``alone.py``) checks the same against each installed wheel; this is the fast check, run with the tests.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from .workspace import ROOT, Distribution, load_distributions

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: cudagraph-config requires tomli there
    import tomli as tomllib

DISTRIBUTIONS = load_distributions()
PACKAGE_TO_DISTRIBUTION = {f"cudagraph.{dist.module}": name for name, dist in DISTRIBUTIONS.items()}

IMPORT_NAMES = {"flashinfer-python": "flashinfer", "pyyaml": "yaml", "ruamel-yaml": "ruamel"}
"""Import names of third-party distributions where they differ from the distribution's name."""

STDLIB_SINCE = {"tomllib": (3, 11)}
"""Standard-library modules newer than the oldest Python the distributions support (3.10), with the version that
added them: the source imports them behind a version check, so they are standard library on every interpreter this
test runs on, even one where ``sys.stdlib_module_names`` does not list them yet."""

STANDARD_LIBRARY = frozenset(sys.stdlib_module_names) | STDLIB_SINCE.keys()

DECLARED_NOT_IMPORTED = {
    ("cudagraph-backend-utils", "numpy"): (
        "torch imports without numpy but warns 'Failed to initialize NumPy' (torch does not declare it); every "
        "distribution here that imports torch depends on cudagraph-backend-utils, so it brings numpy for all"
    ),
}
"""``(distribution, declared distribution)`` that no source imports, and why it is declared anyway."""


def dynamic_imports(name: str) -> dict[str, str]:
    """``{module: why}`` that ``name`` imports by name at run time (``importlib.import_module``), not in its source.

    The shims resolve each legacy name of a ``cudagraph.legacy.*`` module to its new module from the rename table
    (``cudagraph.legacy._module_shim``): those modules' distributions are the shims' dependencies.
    """
    if name != "cudagraph-legacy":
        return {}
    rows = tomllib.loads((ROOT / "refactor" / "renames.toml").read_text())["rename"]
    return {
        row["new"].rsplit(".", 1)[0]: f"refactor/renames.toml: {row['old']}"
        for row in rows
        if row["kind"] == "symbol" and row["old"].startswith("cudagraph.legacy.")
    }


def import_name(requirement_name: str) -> str:
    """The top-level module a third-party distribution is imported as."""
    canonical = canonicalize_name(requirement_name)
    return IMPORT_NAMES.get(canonical, canonical.replace("-", "_"))


def dotted(dist: Distribution, path: Path) -> str:
    """``cudagraph.engine.attention.op`` for ``.../src/cudagraph/engine/attention/op.py`` (packages: their name)."""
    parts = path.relative_to(dist.directory / "src").with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module a (possibly relative) ``from ... import`` in ``module`` names."""
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    base = base[: len(base) - node.level + (1 if is_package else 0)]
    return ".".join([*base, *([node.module] if node.module else [])])


def imported_modules(module: str, is_package: bool, nodes: Iterator[ast.AST]) -> Iterator[str]:
    """Every absolute module ``nodes`` import (``from X import y`` yields ``X`` and ``X.y``, which may be a module)."""
    for node in nodes:
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            target = absolute(module, is_package, node)
            yield target
            yield from (f"{target}.{alias.name}" for alias in node.names if alias.name != "*")


def module_level(tree: ast.Module) -> Iterator[ast.AST]:
    """The imports a module runs whenever it is imported: its body's own statements (not under ``try``, ``if`` or a
    function, where an import may be guarded, conditional or lazy)."""
    yield from (node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom)))


class Source:
    """The modules of one distribution, parsed once."""

    def __init__(self, dist: Distribution) -> None:
        self.dist = dist
        self.trees: dict[str, tuple[Path, bool, ast.Module]] = {}
        for path in sorted(dist.source.rglob("*.py")):
            self.trees[dotted(dist, path)] = (path, path.name == "__init__.py", ast.parse(path.read_text()))

    def imports(self, module: str, everywhere: bool = True) -> set[str]:
        _, is_package, tree = self.trees[module]
        nodes = ast.walk(tree) if everywhere else module_level(tree)
        return set(imported_modules(module, is_package, nodes))

    def where(self, module: str) -> str:
        path = self.trees[module][0]
        return str(path.relative_to(ROOT if path.is_relative_to(ROOT) else self.dist.directory))

    def always_imported(self) -> dict[str, str]:
        """``{module: root}`` for every module of this distribution that a plain ``import cudagraph.X`` or one of its
        console scripts imports (following module-level imports within the distribution), with the root that does."""
        scripts = self.dist.pyproject["project"].get("scripts", {}).values()
        roots = [f"cudagraph.{self.dist.module}", *(target.split(":")[0] for target in scripts)]
        reached: dict[str, str] = {}
        for root in roots:
            stack = [root]
            while stack:
                module = stack.pop()
                if module in reached or module not in self.trees:
                    continue
                reached[module] = root
                for imported in self.imports(module, everywhere=False):
                    parts = imported.split(".")  # importing a submodule imports its packages first
                    stack.extend(".".join(parts[:end]) for end in range(2, len(parts) + 1))
        return reached


def distribution_of(imported: str, dist: Distribution, owners: dict[str, str]) -> str | None:
    """The distribution providing the module ``imported``: a workspace sibling, a declared third-party
    distribution, or (undeclared) the import's top-level name; None for the standard library and ``dist`` itself."""
    top = imported.split(".")[0]
    if top == "__future__" or top in STANDARD_LIBRARY:
        return None
    if top == "cudagraph":
        package = ".".join(imported.split(".")[:2])
        if package == f"cudagraph.{dist.module}":
            return None
        return PACKAGE_TO_DISTRIBUTION.get(package, f"{package} (no workspace distribution ships it)")
    return owners.get(top, top)


def declared(dist: Distribution) -> dict[str, str | None]:
    """``{canonical name: extra or None}`` of every requirement, extras included."""
    found: dict[str, str | None] = {canonicalize_name(req.name): None for req in dist.requirements}
    for extra, requirements in dist.extras.items():
        for req in requirements:
            found.setdefault(canonicalize_name(req.name), extra)
    return found


def import_problems(name: str) -> list[str]:
    """Everything wrong between ``name``'s pyproject and its source's imports, one line each, naming the module."""
    dist = DISTRIBUTIONS[name]
    source = Source(dist)
    wanted = declared(dist)
    owners = {import_name(requirement): requirement for requirement in wanted}
    problems: list[str] = []
    used: dict[str, set[str]] = {}
    for module in source.trees:
        for imported in source.imports(module):
            provider = distribution_of(imported, dist, owners)
            if provider is not None:
                used.setdefault(provider, set()).add(source.where(module))
    for imported, why in dynamic_imports(name).items():
        provider = distribution_of(imported, dist, owners)
        if provider is not None:
            used.setdefault(provider, set()).add(why)
    for provider, modules in sorted(used.items()):
        if canonicalize_name(provider) not in wanted:
            problems.append(f"{name} does not declare {provider}, which {', '.join(sorted(modules))} imports")
    for requirement in sorted(wanted):
        exception = DECLARED_NOT_IMPORTED.get((name, requirement))
        if requirement not in used and exception is None:
            problems.append(f"{name} declares {requirement}, which no module of cudagraph.{dist.module} imports")
        elif requirement in used and exception is not None:
            problems.append(f"{name} imports {requirement} now: drop its entry from DECLARED_NOT_IMPORTED")

    # A distribution only an extra brings must not be imported by a plain `import cudagraph.X` (or a script).
    for module, root in sorted(source.always_imported().items()):
        for imported in sorted(source.imports(module, everywhere=False)):
            provider = distribution_of(imported, dist, owners)
            extra = wanted.get(canonicalize_name(provider)) if provider is not None else None
            if extra is not None:
                problems.append(
                    f"{source.where(module)} imports {provider} at module level and `import {root}` imports it, "
                    f"but only {name}[{extra}] declares {provider}: import it lazily or declare it"
                )
    return sorted(set(problems))


@pytest.mark.parametrize("name", sorted(DISTRIBUTIONS))
def test_each_distribution_declares_exactly_what_it_imports(name: str) -> None:
    assert import_problems(name) == []


def test_every_exception_names_a_declared_requirement_of_a_workspace_distribution() -> None:
    for name, requirement in DECLARED_NOT_IMPORTED:
        assert requirement in declared(DISTRIBUTIONS[name]), f"{name} no longer declares {requirement}"


def test_an_undeclared_import_and_an_unused_declaration_are_named(tmp_path: Path) -> None:
    """The check itself, on a made-up distribution: it names the package and the module."""
    package = tmp_path / "src" / "cudagraph" / "made_up"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("from . import core\n")
    (package / "core.py").write_text("import torch\n\ndef later():\n    import yaml\n")
    (package / "optional.py").write_text("import numpy\n")
    pyproject = {"project": {"name": "made-up", "dependencies": ["torch>=2.4", "tqdm>=4"]}}
    requirements = tuple(Requirement(text) for text in pyproject["project"]["dependencies"])
    dist = Distribution(tmp_path, "made-up", "0.1.0", requirements, {}, pyproject)
    DISTRIBUTIONS["made-up"] = dist
    try:
        problems = import_problems("made-up")
    finally:
        del DISTRIBUTIONS["made-up"]
    assert problems == [
        "made-up declares tqdm, which no module of cudagraph.made_up imports",
        "made-up does not declare numpy, which src/cudagraph/made_up/optional.py imports",
        "made-up does not declare yaml, which src/cudagraph/made_up/core.py imports",
    ]


@pytest.mark.parametrize("module", sorted(STDLIB_SINCE))
def test_each_newer_standard_library_module_is_standard_library_from_its_version(module: str) -> None:
    if sys.version_info >= STDLIB_SINCE[module]:
        assert module in sys.stdlib_module_names
    else:
        assert module not in sys.stdlib_module_names, f"{module} is standard library here: drop it from STDLIB_SINCE"
