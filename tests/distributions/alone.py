"""Install each distribution alone from ``dist/`` into a fresh venv and prove it works there (``nox -s packaging``).

For every workspace distribution, with the sdists and wheels that ``nox -s build`` put in ``dist/``:

1. the wheel's metadata is complete (version, LICENSE, README, classifiers, ``Requires-Python``) and it
   ships no ``cudagraph/__init__.py`` (the namespace is PEP 420);
2. a new venv gets torch first when the distribution needs it (the pinned CPU build, with plain pip, which takes the
   local wheel), then its other third-party requirements from the index, then the distribution itself with
   ``pip install --no-index --find-links dist NAME``, so every ``cudagraph-*`` sibling must come from ``dist/``;
3. the ``cudagraph-*`` distributions installed are exactly the declared closure;
4. every module the wheel ships imports, with no warning (a module that needs an extra that is not installed is
   reported, not failed); every console script and ``python -m`` entry answers ``--help``; the data a wheel bundles
   (the rename table, the migrate example) is found inside the install;
5. every top-level import in the shipped modules (found with ``ast``) is the standard library, a requirement the
   distribution declares (extras included) or a ``cudagraph`` sibling it declares.

One line per distribution, then a summary; exit 1 if any distribution failed.
"""

from __future__ import annotations

import argparse
import ast
import configparser
import email.parser
import json
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from .workspace import ROOT, load_distributions

REQUIRED_METADATA = ("Version", "Requires-Python", "License-Expression", "Description-Content-Type")
# Import names of requirements that differ from the distribution name, for requirements not installed in the venv
# (an extra); installed ones are mapped by `importlib.metadata.packages_distributions()` there.
IMPORT_NAMES = {"flashinfer-python": "flashinfer", "pyyaml": "yaml", "ruamel-yaml": "ruamel"}

# Runs inside the venv: import every module, record what fails and what warns, and map import names to distributions.
CHECK_IMPORTS = """
import importlib, importlib.metadata, json, sys, warnings
result = {"failed": {}, "missing": {}, "warnings": {}}
for module in json.loads(sys.argv[1]):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as error:
            result["missing"][module] = error.name
        except Exception as error:
            result["failed"][module] = f"{type(error).__name__}: {error}"
    # the legacy shims warn by design (DeprecationWarning / FutureWarning); anything else is a packaging problem
    noisy = [str(w.message) for w in caught if not issubclass(w.category, (DeprecationWarning, FutureWarning))]
    if noisy:
        result["warnings"][module] = noisy
result["distributions"] = importlib.metadata.packages_distributions()
print(json.dumps(result))
"""

# What an installed distribution must find inside its own wheel, not in a checkout (run inside the venv).
SMOKE = {
    "cudagraph-config": (
        "from cudagraph.config.renames import PACKAGED_RENAMES_PATH, load_renames, renames_path;"
        "assert renames_path() == PACKAGED_RENAMES_PATH, renames_path(); assert len(load_renames()) > 0"
    ),
    "cudagraph-migrate": (
        "import sysconfig; from cudagraph.migrate import example, guide;"
        "assert str(example.example_source()).startswith(sysconfig.get_paths()['purelib']), example.example_source();"
        "assert guide.guide_path() == guide.PACKAGED_GUIDE_PATH, guide.guide_path();"
        "assert '### Calls the new API does not accept' in guide.explain('CG101')"
    ),
}


@dataclass
class Wheel:
    """What one built wheel declares and ships."""

    path: Path
    name: str
    version: str
    metadata: email.message.Message
    requirements: list[Requirement]
    scripts: list[str]
    modules: dict[str, str]  # dotted name -> source
    license_text: str | None

    def runtime_requirements(self) -> list[Requirement]:
        """The requirements an install without extras gets (markers evaluated here)."""
        return [req for req in self.requirements if req.marker is None or req.marker.evaluate({"extra": ""})]


@dataclass
class Outcome:
    """What checking one distribution found."""

    name: str
    version: str = "?"
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    summary: str = ""
    seconds: float = 0.0


def read_wheel(path: Path) -> Wheel:
    """Metadata, console scripts, modules and license of the wheel at ``path``."""
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
        (info,) = {name.split("/")[0] for name in names if name.split("/")[0].endswith(".dist-info")}
        metadata = email.parser.Parser().parsestr(archive.read(f"{info}/METADATA").decode())
        scripts: list[str] = []
        if f"{info}/entry_points.txt" in names:
            entry_points = configparser.ConfigParser()
            entry_points.read_string(archive.read(f"{info}/entry_points.txt").decode())
            if entry_points.has_section("console_scripts"):
                scripts = sorted(entry_points["console_scripts"])
        modules = {}
        for name in names:
            if name.startswith("cudagraph/") and name.endswith(".py") and "/data/" not in name:
                dotted = name[: -len(".py")].replace("/", ".").removesuffix(".__init__")
                modules[dotted] = archive.read(name).decode()
        license_name = f"{info}/licenses/LICENSE"
        license_text = archive.read(license_name).decode() if license_name in names else None
    requirements = [Requirement(text) for text in metadata.get_all("Requires-Dist") or []]
    return Wheel(path, metadata["Name"], metadata["Version"], metadata, requirements, scripts, modules, license_text)


def check_metadata(wheel: Wheel, expected_version: str, dist_dir: Path) -> list[str]:
    """Problems with what the wheel says about itself, and a missing sdist."""
    problems = [f"metadata lacks {key}" for key in REQUIRED_METADATA if not wheel.metadata.get(key)]
    if wheel.version != expected_version:
        problems.append(f"wheel version {wheel.version}, source says {expected_version}")
    if not wheel.metadata.get_payload().strip():
        problems.append("no README (empty long description)")
    if not wheel.metadata.get_all("Classifier"):
        problems.append("no classifiers")
    if wheel.license_text != (ROOT / "LICENSE").read_text():
        problems.append("dist-info/licenses/LICENSE missing or not the repository's LICENSE")
    if "cudagraph" in wheel.modules:
        problems.append("ships cudagraph/__init__.py (the namespace must stay PEP 420)")
    sdist = dist_dir / f"{wheel.name.replace('-', '_')}-{wheel.version}.tar.gz"
    if not sdist.is_file():
        problems.append(f"no sdist {sdist.name}")
    return problems


def closure(name: str, wheels: dict[str, Wheel]) -> tuple[set[str], list[Requirement]]:
    """The ``cudagraph-*`` siblings ``name`` pulls in (transitively) and their third-party requirements."""
    siblings: set[str] = set()
    third_party: dict[str, Requirement] = {}
    stack = [name]
    while stack:
        current = stack.pop()
        if current in siblings:
            continue
        siblings.add(current)
        for requirement in wheels[current].runtime_requirements():
            if canonicalize_name(requirement.name) in wheels:
                stack.append(canonicalize_name(requirement.name))
            else:
                third_party.setdefault(str(requirement), requirement)
    siblings.discard(name)
    return siblings, list(third_party.values())


def top_level_imports(source: str) -> set[tuple[str, str | None]]:
    """``(top-level package, cudagraph subpackage or None)`` for every absolute import in ``source``."""
    found: set[tuple[str, str | None]] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            dotted = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "cudagraph":
                dotted = [f"cudagraph.{alias.name}" for alias in node.names]
            else:
                dotted = [node.module]
        else:
            continue
        for name in dotted:
            parts = name.split(".")
            found.add((parts[0], parts[1] if parts[0] == "cudagraph" and len(parts) > 1 else None))
    return found


def undeclared_imports(wheel: Wheel, wheels: dict[str, Wheel], installed: dict[str, list[str]]) -> list[str]:
    """Imports of packages ``wheel`` does not declare: not stdlib, not a declared requirement, not itself."""
    declared = {canonicalize_name(req.name) for req in wheel.requirements}  # extras included
    owner = {module.split(".")[1]: name for name, other in wheels.items() for module in other.modules if "." in module}
    problems = set()
    for module, source in wheel.modules.items():
        for top, subpackage in top_level_imports(source):
            if top == "__future__" or top in sys.stdlib_module_names:
                continue
            if top == "cudagraph":
                provider = owner.get(subpackage or "")
                if provider != canonicalize_name(wheel.name) and provider not in declared:
                    problems.add(f"{module} imports cudagraph.{subpackage} ({provider or 'no distribution'})")
                continue
            providers = {canonicalize_name(dist) for dist in installed.get(top, [])}
            if providers:
                if not providers & declared:
                    problems.add(f"{module} imports {top} (from {', '.join(sorted(providers))}), not declared")
            elif not any(IMPORT_NAMES.get(name, name.replace("-", "_")) == top for name in declared):
                problems.add(f"{module} imports {top}, which is neither installed nor declared")
    return sorted(problems)


def run(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    """``subprocess.run`` capturing text output, never raising on a non-zero exit."""
    return subprocess.run(command, capture_output=True, text=True, check=False, **kwargs)  # type: ignore[call-overload]


def check_alone(name: str, wheels: dict[str, Wheel], dist_dir: Path, torch: str, workdir: Path) -> Outcome:
    """Install ``name`` alone into a fresh venv under ``workdir`` and check it there."""
    started = time.monotonic()
    wheel = wheels[name]
    outcome = Outcome(name, wheel.version)
    siblings, third_party = closure(name, wheels)
    venv_dir = workdir / name
    python = venv_dir / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "-q"]
    steps = [[sys.executable, "-m", "venv", str(venv_dir)]]
    # torch first, from the pinned local CPU build, so the ranges below install nothing more
    if any(canonicalize_name(req.name) == "torch" for req in third_party):
        steps.append([*pip, torch])
    if third_party:
        steps.append([*pip, *(str(req) for req in third_party)])
    steps.append([*pip, "--no-index", "--find-links", str(dist_dir), name])
    for step in steps:
        result = run(step, cwd=workdir)
        if result.returncode != 0:
            outcome.problems.append(f"`{' '.join(step[2:])}` failed: {result.stderr.strip()[-600:]}")
            outcome.seconds = time.monotonic() - started
            return outcome

    listed = json.loads(run([str(python), "-m", "pip", "list", "--format=json"], cwd=workdir).stdout)
    present = {canonicalize_name(item["name"]) for item in listed if item["name"].startswith("cudagraph")}
    if present != siblings | {name}:
        outcome.problems.append(f"installed {sorted(present)}, declared closure {sorted(siblings | {name})}")

    modules = sorted(module for module in wheel.modules if not module.endswith("__main__"))
    result = run([str(python), "-c", CHECK_IMPORTS, json.dumps(modules)], cwd=workdir)
    if result.returncode != 0:
        outcome.problems.append(f"import check crashed: {result.stderr.strip()[-600:]}")
        outcome.seconds = time.monotonic() - started
        return outcome
    report = json.loads(result.stdout.splitlines()[-1])
    extras = {
        canonicalize_name(req.name): extra
        for req in wheel.requirements
        if req.marker is not None and not req.marker.evaluate({"extra": ""})
        for extra in wheel.metadata.get_all("Provides-Extra") or []
        if req.marker.evaluate({"extra": extra})
    }
    for module, missing in report["missing"].items():
        extra = next((x for dist, x in extras.items() if IMPORT_NAMES.get(dist, dist) == missing), None)
        if extra is None:
            outcome.problems.append(f"import {module}: no module named {missing}")
        else:
            outcome.notes.append(f"{module} needs [{extra}]")
    outcome.problems += [f"import {module}: {error}" for module, error in report["failed"].items()]
    outcome.problems += [f"import {module} warns: {' | '.join(msgs)}" for module, msgs in report["warnings"].items()]
    outcome.problems += undeclared_imports(wheel, wheels, report["distributions"])

    entries = [[str(venv_dir / "bin" / script), "--help"] for script in wheel.scripts]
    mains = [module.removesuffix(".__main__") for module in wheel.modules if module.endswith(".__main__")]
    entries += [[str(python), "-m", package, "--help"] for package in mains]
    for entry in entries:
        result = run(entry, cwd=workdir)
        if result.returncode != 0 or "Traceback" in result.stderr:
            shown = " ".join(Path(entry[0]).name if i == 0 else part for i, part in enumerate(entry))
            outcome.problems.append(f"`{shown}` exit {result.returncode}: {result.stderr.strip()[-400:]}")

    if name in SMOKE:
        result = run([str(python), "-c", SMOKE[name]], cwd=workdir)
        if result.returncode != 0:
            outcome.problems.append(f"packaged data not found: {result.stderr.strip()[-400:]}")

    imported = len(modules) - len(report["missing"]) - len(report["failed"])
    outcome.summary = (
        f"alone with {len(siblings)} sibling(s) and {len(third_party)} third-party requirement(s); "
        f"{imported}/{len(modules)} modules import; {len(entries)} --help entr{'y' if len(entries) == 1 else 'ies'}"
    )
    outcome.seconds = time.monotonic() - started
    return outcome


def main(argv: list[str] | None = None) -> int:
    """Check every workspace distribution in ``--dist``; print one line each and a summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dist", type=Path, default=ROOT / "dist", help="folder with the sdists and wheels")
    parser.add_argument("--torch", default="torch==2.13.0", help="torch requirement installed first")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="venvs built at once")
    parser.add_argument("names", nargs="*", help="distributions to check (default: all)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    dist_dir = args.dist.resolve()
    expected = {name: dist.version for name, dist in load_distributions().items()}
    wheels: dict[str, Wheel] = {}
    outcomes: dict[str, Outcome] = {}
    for name, version in expected.items():
        path = dist_dir / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
        if not path.is_file():
            outcomes[name] = Outcome(name, version, problems=[f"no wheel {path.name} in {dist_dir}"])
            continue
        wheels[name] = read_wheel(path)
        outcomes[name] = Outcome(name, version, problems=check_metadata(wheels[name], version, dist_dir))
    names = [name for name in args.names or sorted(wheels) if name in wheels]
    with tempfile.TemporaryDirectory(prefix="cudagraph-alone-") as tmp, ThreadPoolExecutor(args.jobs) as pool:
        futures = {name: pool.submit(check_alone, name, wheels, dist_dir, args.torch, Path(tmp)) for name in names}
        for name, future in futures.items():
            checked = future.result()
            checked.problems[:0] = outcomes[name].problems
            outcomes[name] = checked
            status = "ok  " if not checked.problems else "FAIL"
            notes = f" ({'; '.join(checked.notes)})" if checked.notes else ""
            print(f"{status} {name} {checked.version}: {checked.summary}{notes} [{checked.seconds:.0f}s]", flush=True)
            for problem in checked.problems:
                print(f"       {problem}", flush=True)
    checked_names = [name for name in outcomes if name in names or name not in wheels]
    failed = [name for name in checked_names if outcomes[name].problems]
    print(
        f"packaging: {len(checked_names) - len(failed)}/{len(checked_names)} distributions install alone from "
        f"{args.dist} and pass"
        + (f"; FAILED: {', '.join(failed)}" if failed else "")
        + f" [{time.monotonic() - started:.0f}s]"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
