"""Behavioural proof of the migration on downstream plugins (``tests/codemods/plugins``).

Every folder there with a ``tests/`` folder is a plugin (``legacy_api`` is the stand-in of the legacy SGLang API the
plugins are written against). For each:

1. its own tests pass before migration, against the stand-in;
2. ``cudagraph-migrate`` rewrites a copy, and the tests pass again (the stand-in stays importable for the names a
   TODO keeps on the legacy API);
3. every place still tied to the legacy API carries a ``# TODO(cudagraph-migrate):`` comment, every place passing
   another program's legacy options (``ServerArgs(...)`` keywords, ``server_args.<option>``, command lines) is named
   in the report, and so is every place maybe tied to SGLang in a file that imports it (a legacy member on a receiver
   of unknown type, by attribute or by name string; a config-class field named like SGLang's option); and the summary
   counts the TODOs;
4. a second run changes nothing;
5. the plugin gets the outcome its ``expected.toml`` describes.

What is tied to the legacy API is found here with :mod:`ast`, independently of the codemods: imports, bases and
calls resolved through each file's imports, and receivers typed by ``self``, ``super()``, annotations, constructor
calls and a small table of what SGLang's classes hold.
"""

from __future__ import annotations

import ast
import difflib
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cudagraph.migrate import command
from cudagraph.migrate.renames import RenameKind, RenameTable, load_renames

PLUGINS_ROOT = Path(__file__).parent / "plugins"
LEGACY_API = PLUGINS_ROOT / "legacy_api"
PLUGINS = sorted(path for path in PLUGINS_ROOT.iterdir() if (path / "tests").is_dir())
TODO = "# TODO(cudagraph-migrate):"
CONTINUATION = "#   "
"""How each further line of a long TODO comment starts (the comment is wrapped)."""

SERVER_ARGS = "sglang.srt.server_args.ServerArgs"
MODEL_RUNNER = "sglang.srt.model_executor.model_runner.ModelRunner"
CUDA_GRAPH_RUNNER = "sglang.srt.model_executor.cuda_graph_runner.CudaGraphRunner"
NAME_STRING_CALLS = frozenset({"getattr", "hasattr", "setattr", "delattr"})
"""Calls whose second argument names a member of the first."""
CONFIG_DECORATORS = frozenset({"dataclass", "define", "frozen", "mutable"})
"""Decorators (their last name) of classes whose annotated class attributes are fields."""
CONFIG_BASES = frozenset({"BaseModel", "BaseSettings", "NamedTuple", "TypedDict"})
"""Bases (their last name) of classes whose annotated class attributes are fields."""

# What SGLang's classes hold, by type, so ``self.model_runner.server_args.disable_cuda_graph`` is tied as SGLang's
# own annotations tie it.
SGLANG_ATTRIBUTE_TYPES: Mapping[tuple[str, str], str] = {
    (MODEL_RUNNER, "server_args"): SERVER_ARGS,
    (MODEL_RUNNER, "graph_runner"): CUDA_GRAPH_RUNNER,
    (CUDA_GRAPH_RUNNER, "model_runner"): MODEL_RUNNER,
    ("sglang.srt.entrypoints.engine.Engine", "server_args"): SERVER_ARGS,
    ("sglang.Engine", "server_args"): SERVER_ARGS,
}


# --- the legacy API, as the rename table names it ---


@dataclass(frozen=True)
class LegacyApi:
    """The legacy names a migrated plugin may still reach."""

    modules: frozenset[str]
    """Legacy modules (``module`` rows): importing one is a legacy place."""
    members: Mapping[str, frozenset[str]]
    """Attribute and method names, each with the classes (new and legacy qualified names) it belongs to."""
    options: Mapping[str, frozenset[str]]
    """Server-argument keywords, each with the legacy engine classes that take it (``ServerArgs``, ``Engine``)."""
    flags: frozenset[str]
    """Legacy command-line flags."""

    @classmethod
    def from_table(cls, table: RenameTable) -> LegacyApi:
        """The legacy API of ``table``."""
        member_rows = table.of_kind(RenameKind.ATTRIBUTE, RenameKind.METHOD)
        return cls(
            modules=frozenset(table.modules),
            members={row.old: frozenset(row.owners + row.legacy_owners) for row in member_rows},
            options={row.old: frozenset(row.legacy_owners) for row in table.of_kind(RenameKind.KWARG)},
            flags=frozenset(row.old for row in table.of_kind(RenameKind.CLI_FLAG)),
        )

    def is_legacy_name(self, qualified: str | None) -> bool:
        """Whether ``qualified`` is a legacy module or a name defined in one."""
        return qualified is not None and (qualified in self.modules or qualified.rpartition(".")[0] in self.modules)

    def flags_in(self, text: str) -> list[str]:
        """The legacy flags among the whitespace-separated words of ``text`` (``--flag`` or ``--flag=value``)."""
        return [word for word in text.split() if word.partition("=")[0] in self.flags]


LEGACY = LegacyApi.from_table(load_renames())


def standin_reexports(root: Path) -> dict[str, str]:
    """``module.Name -> defining module.Name`` for the names the stand-in's modules import from one another at their
    top level (``sglang.srt.entrypoints.http_server.ServerArgs``), so a plugin importing SGLang's classes through a
    module that re-exports them is read as SGLang's does at run time."""
    imported: dict[str, str] = {}
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root).with_suffix("")
        module = ".".join(relative.parts[:-1] if relative.name == "__init__" else relative.parts)
        for statement in ast.parse(path.read_text()).body:
            if isinstance(statement, ast.ImportFrom) and statement.level == 0 and statement.module:
                for alias in statement.names:
                    imported[f"{module}.{alias.asname or alias.name}"] = f"{statement.module}.{alias.name}"
    resolved = {}
    for name, target in imported.items():
        seen = {name}
        while target in imported and target not in seen:
            seen.add(target)
            target = imported[target]
        resolved[name] = target
    return resolved


STANDIN_REEXPORTS = standin_reexports(LEGACY_API)
SGLANG_PACKAGES = frozenset(owner.partition(".")[0] for owners in LEGACY.options.values() for owner in owners)
"""Top-level packages of the classes that take SGLang's options: a file importing one drives SGLang."""
DICT_KEY_METHODS = frozenset({"setdefault", "get", "pop", "__getitem__", "__setitem__"})
DICT_FILLING_METHODS = frozenset({"setdefault", "update", "__setitem__"})


# --- an independent reading of a plugin's code ---


@dataclass(frozen=True)
class Place:
    """A statement of a migrated file that still reaches the legacy API, or passes another program's options."""

    path: Path
    first_line: int
    last_line: int
    """Last line of the statement's own text (a compound statement's header only)."""
    what: str

    def __str__(self) -> str:
        return f"{self.path.name}:{self.first_line}: {self.what}"


@dataclass
class SourceFile:
    """One Python file of a plugin, parsed, with what its imports bind."""

    path: Path
    module: str
    lines: list[str]
    tree: ast.Module
    imports: dict[str, str] = field(default_factory=dict)
    """Local name -> qualified name it is bound to (``from m import N as a``: ``a -> m.N``)."""
    classes: dict[str, ast.ClassDef] = field(default_factory=dict)
    """Qualified name -> definition, for the file's module-level classes."""

    @classmethod
    def read(cls, path: Path, root: Path) -> SourceFile:
        """Parse ``path``; its module name is its path under ``root``."""
        relative = path.relative_to(root).with_suffix("")
        parts = relative.parts[:-1] if relative.name == "__init__" else relative.parts
        source = path.read_text()
        file = cls(path, ".".join(parts), source.splitlines(), ast.parse(source))
        for statement in file.tree.body:
            if isinstance(statement, ast.ClassDef):
                file.classes[f"{file.module}.{statement.name}"] = statement
        for node in ast.walk(file.tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        file.imports[alias.asname] = alias.name
                    else:
                        head = alias.name.partition(".")[0]
                        file.imports[head] = head
            elif isinstance(node, ast.ImportFrom):
                module = file._absolute(node)
                for alias in node.names:
                    file.imports[alias.asname or alias.name] = f"{module}.{alias.name}"
        return file

    @property
    def imports_sglang(self) -> bool:
        """Whether the file imports anything of SGLang: a place there that may reach SGLang's classes must be named."""
        return any(qualified.partition(".")[0] == "sglang" for qualified in self.imports.values())

    def _absolute(self, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        package = self.module.rsplit(".", node.level)[0] if self.path.name != "__init__.py" else self.module
        return ".".join(part for part in (package, node.module) if part)

    def resolve(self, node: ast.expr) -> str | None:
        """The qualified name ``node`` refers to through this file's imports and classes, if any."""
        if isinstance(node, ast.Name):
            local = f"{self.module}.{node.id}"
            return self.imports.get(node.id, local if local in self.classes else None)
        if isinstance(node, ast.Attribute):
            base = self.resolve(node.value)
            return f"{base}.{node.attr}" if base else None
        if isinstance(node, ast.Constant) and isinstance(node.value, str):  # a string annotation
            try:
                return self.resolve(ast.parse(node.value, mode="eval").body)
            except SyntaxError:
                return None
        return None

    def statement_lines(self, statement: ast.stmt) -> tuple[int, int]:
        """First and last line of a statement's own text: a compound statement's header, with its decorators."""
        decorators = getattr(statement, "decorator_list", [])
        first = min([statement.lineno, *(decorator.lineno for decorator in decorators)])
        body = getattr(statement, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
            return first, max(first, body[0].lineno - 1)
        return first, statement.end_lineno or statement.lineno

    def marked(self, place: Place) -> bool:
        """Whether the statement, or the comment lines directly above it, hold a TODO(cudagraph-migrate) comment."""
        if any(TODO in line for line in self.lines[place.first_line - 1 : place.last_line]):
            return True
        index = place.first_line - 2
        while index >= 0 and self.lines[index].strip().startswith("#"):
            if self.lines[index].strip().startswith(TODO):
                return True
            index -= 1
        return False


class PluginCode:
    """Every Python file of a plugin, and the ancestry of its classes."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.files = [SourceFile.read(path, root) for path in sorted(root.rglob("*.py"))]
        self.bases: dict[str, list[str]] = {}
        for file in self.files:
            for qualified, node in file.classes.items():
                self.bases[qualified] = [base for base in map(file.resolve, node.bases) if base]

    def ancestry(self, qualified: str | None) -> frozenset[str]:
        """``qualified`` and every class it derives from, as far as the plugin's own classes tell."""
        seen: set[str] = set()
        pending = [STANDIN_REEXPORTS.get(qualified, qualified)] if qualified else []
        while pending:
            name = pending.pop()
            if name not in seen:
                seen.add(name)
                pending += self.bases.get(name, [])
        return frozenset(seen)

    def places(self) -> tuple[list[tuple[SourceFile, Place]], list[tuple[SourceFile, Place]]]:
        """The legacy API places, and the places passing another program's legacy options, of every file."""
        legacy: list[tuple[SourceFile, Place]] = []
        options: list[tuple[SourceFile, Place]] = []
        for file in self.files:
            reader = _PlaceReader(self, file)
            reader.visit(file.tree)
            legacy += [(file, place) for place in reader.legacy]
            options += [(file, place) for place in reader.options]
        return legacy, options


class _PlaceReader(ast.NodeVisitor):
    """Walks one file, typing receivers as it goes, and records the places that reach the legacy API."""

    def __init__(self, code: PluginCode, file: SourceFile) -> None:
        self.code = code
        self.file = file
        self.classes: list[str] = []
        self.scopes: list[dict[str, frozenset[str]]] = [{}]
        self.statements: list[ast.stmt] = []
        self.legacy: list[Place] = []
        self.options: list[Place] = []
        self.drives_sglang = any(
            name.partition(".")[0] in SGLANG_PACKAGES for name in file.imports.values()
        ) and not file.module.startswith(tuple(SGLANG_PACKAGES))
        """Whether the file imports SGLang: its dicts with SGLang's option keys are SGLang's options."""
        self.filled = _filled_dicts(file.tree) if self.drives_sglang else {}

    # where a place is: the innermost statement holding it

    def visit(self, node: ast.AST) -> None:
        if isinstance(node, ast.stmt):
            self.statements.append(node)
            try:
                super().visit(node)
            finally:
                self.statements.pop()
        else:
            super().visit(node)

    def _record(self, into: list[Place], what: str, statement: ast.stmt | None = None) -> None:
        first, last = self.file.statement_lines(statement or self.statements[-1])
        into.append(Place(self.file.path, first, last, what))

    def _member_use(self, receiver: ast.expr, name: str, how: str) -> None:
        """A legacy member reached on ``receiver``: a legacy place when its type is one of the member's classes, a
        place maybe tied (to be named) when its type is unknown in a file importing SGLang."""
        held = self.type_of(receiver)
        if held & LEGACY.members[name]:
            self._record(self.legacy, f"{how} of {ast.unparse(receiver)}")
        elif not held and self.file.imports_sglang:
            self._record(self.options, f"{how} of {ast.unparse(receiver)}, maybe SGLang's")

    # what a name or expression holds

    def type_of(self, node: ast.expr) -> frozenset[str]:
        """The classes (with their ancestry) whose instance ``node`` holds, as far as this reading can tell."""
        if isinstance(node, ast.Name):
            for scope in reversed(self.scopes):
                if node.id in scope:
                    return scope[node.id]
            return frozenset()
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Name) and node.func.id == "super" and self.classes:
                return self.code.ancestry(self.classes[-1])
            return self.code.ancestry(self.file.resolve(node.func))
        if isinstance(node, ast.Attribute):
            held = {SGLANG_ATTRIBUTE_TYPES.get((owner, node.attr)) for owner in self.type_of(node.value)}
            return frozenset().union(*(self.code.ancestry(name) for name in held if name))
        return frozenset()

    # scopes

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for base in node.bases:
            if LEGACY.is_legacy_name(self.file.resolve(base)):
                self._record(self.legacy, f"class {node.name} derives from legacy {ast.unparse(base)}")
        if self.file.imports_sglang and _is_config_class(node):
            for statement in node.body:
                if isinstance(statement, ast.AnnAssign) and ast.unparse(statement.target) in LEGACY.options:
                    what = f"config field {node.name}.{ast.unparse(statement.target)} named like SGLang's option"
                    self._record(self.options, what, statement)
        self.classes.append(f"{self.file.module}.{node.name}")
        self.generic_visit(node)
        self.classes.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        # a method: defined directly in a class body (statements[-1] is this definition)
        in_class = len(self.statements) >= 2 and isinstance(self.statements[-2], ast.ClassDef)
        if in_class and node.name in LEGACY.members:
            owners = self.code.ancestry(self.classes[-1])
            if owners & LEGACY.members[node.name]:
                self._record(self.legacy, f"def {node.name} in a class tied to {sorted(owners)}")
        scope: dict[str, frozenset[str]] = {}
        parameters = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
        is_static = any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in node.decorator_list)
        if in_class and parameters and not is_static:
            scope[parameters[0].arg] = self.code.ancestry(self.classes[-1])
        for parameter in parameters:
            if parameter.annotation is not None:
                scope[parameter.arg] = self.code.ancestry(self.file.resolve(parameter.annotation))
        self.scopes.append(scope)
        self.generic_visit(node)
        self.scopes.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Assign(self, node: ast.Assign) -> None:
        self.generic_visit(node)
        held = self.type_of(node.value)
        for target in node.targets:
            if isinstance(target, ast.Name) and held:
                self.scopes[-1][target.id] = held

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self.generic_visit(node)
        if isinstance(node.target, ast.Name):
            self.scopes[-1][node.target.id] = self.code.ancestry(self.file.resolve(node.annotation))

    # the places

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name in LEGACY.modules:
                self._record(self.legacy, f"import {alias.name}")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = self.file._absolute(node)
        if module in LEGACY.modules or any(f"{module}.{alias.name}" in LEGACY.modules for alias in node.names):
            self._record(self.legacy, f"from {module} import ...")

    def visit_Call(self, node: ast.Call) -> None:
        callee = self.file.resolve(node.func)
        if LEGACY.is_legacy_name(callee):
            self._record(self.legacy, f"call of legacy {callee}")
        name = node.args[1] if isinstance(node.func, ast.Name) and node.func.id in NAME_STRING_CALLS else None
        if isinstance(name, ast.Constant) and name.value in LEGACY.members:
            self._member_use(node.args[0], name.value, f"{node.func.id}(..., {name.value!r})")
        takers = self.code.ancestry(callee)
        for keyword in node.keywords:
            if keyword.arg is not None and takers & LEGACY.options.get(keyword.arg, frozenset()):
                self._record(self.options, f"{keyword.arg}= passed to {callee}")
            splatted = ast.unparse(keyword.value) if keyword.arg is None else None
            if splatted in self.filled and takers & frozenset().union(*LEGACY.options.values()):
                self._record(self.options, f"**{splatted} (holding {sorted(self.filled[splatted])}) into {callee}")
        if self.drives_sglang:
            method = node.func.attr if isinstance(node.func, ast.Attribute) else None
            if method in DICT_KEY_METHODS and node.args and _option_key(node.args[0]):
                self._record(self.options, f"{method}({_option_key(node.args[0])!r})")
            if (isinstance(node.func, ast.Name) and node.func.id == "dict") or method == "update":
                for keyword in node.keywords:
                    if keyword.arg in LEGACY.options:
                        self._record(self.options, f"{keyword.arg}= in {ast.unparse(node.func)}(...)")
        self.generic_visit(node)

    def visit_Dict(self, node: ast.Dict) -> None:
        if self.drives_sglang:
            for key in node.keys:
                if key is not None and _option_key(key):
                    self._record(self.options, f"dict key {_option_key(key)!r}")
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if self.drives_sglang and _option_key(node.slice):
            self._record(self.options, f"[{_option_key(node.slice)!r}]")
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr in LEGACY.members:
            self._member_use(node.value, node.attr, f".{node.attr}")
        if node.attr in LEGACY.options and self.type_of(node.value) & LEGACY.options[node.attr]:
            self._record(self.options, f".{node.attr} of {ast.unparse(node.value)}")
        self.generic_visit(node)

    def visit_Expr(self, node: ast.Expr) -> None:
        if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            return  # a docstring: prose, not a command line
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and len(node.value.split()) > 1 and LEGACY.flags_in(node.value):
            self._record(self.options, f"command string with {', '.join(LEGACY.flags_in(node.value))}")

    def _visit_sequence(self, node: ast.List | ast.Tuple | ast.Set) -> None:
        for element in node.elts:
            if isinstance(element, ast.Constant) and isinstance(element.value, str) and LEGACY.flags_in(element.value):
                self._record(self.options, f"argument list with {element.value}")
        self.generic_visit(node)

    visit_List = visit_Tuple = visit_Set = _visit_sequence


def _is_config_class(node: ast.ClassDef) -> bool:
    """A dataclass, an attrs class or a class of annotated fields (pydantic, ``NamedTuple``, ``TypedDict``)."""

    def last(expression: ast.expr) -> str:
        target = expression.func if isinstance(expression, ast.Call) else expression
        return ast.unparse(target).rpartition(".")[2]

    return any(last(decorator) in CONFIG_DECORATORS for decorator in node.decorator_list) or any(
        last(base) in CONFIG_BASES for base in node.bases
    )


def _option_key(node: ast.AST) -> str | None:
    """The legacy option a string constant names, if it does."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in LEGACY.options:
        return node.value
    return None


def _filled_dicts(tree: ast.Module) -> dict[str, set[str]]:
    """What each name (as spelled) is filled with of SGLang's options: assigned a dict literal or ``dict(...)`` with
    option keys, or given one by ``setdefault``/``update``/``__setitem__`` or a subscript store."""
    filled: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        target, keys = None, []
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
            if isinstance(value, ast.Dict):
                keys = [key for key in map(_option_key, value.keys) if key]
            elif isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "dict":
                keys = [keyword.arg for keyword in value.keywords if keyword.arg in LEGACY.options]
            if isinstance(target, ast.Subscript):
                target, keys = target.value, [key for key in [_option_key(target.slice)] if key]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in DICT_FILLING_METHODS
        ):
            target = node.func.value
            keys = [keyword.arg for keyword in node.keywords if keyword.arg in LEGACY.options]
            keys += [key for key in [_option_key(node.args[0]) if node.args else None] if key]
        if target is not None and keys:
            filled.setdefault(ast.unparse(target), set()).update(key for key in keys if key)
    return filled


def named_lines(report: str, path: Path) -> set[int]:
    """The lines of ``path`` the migration report names (``<path>: [CODE ]<line>: ...``)."""
    pattern = re.compile(re.escape(str(path)) + r":\s*(?:[A-Z]+\d+\s+)?(\d+)\b")
    return {int(match.group(1)) for match in pattern.finditer(report)}


# --- running the plugins and the migration ---


@dataclass(frozen=True)
class Expectation:
    """What a migration must do to one plugin (its ``expected.toml``)."""

    must_keep: tuple[str, ...]
    must_move: tuple[str, ...]
    todo_mentions: tuple[str, ...]
    left_alone: tuple[str, ...]
    unchanged: bool
    advised: bool = True
    """False: the report may give this plugin no TODO and no advice (another engine's own names and flags)."""

    @classmethod
    def of(cls, plugin: Path) -> Expectation:
        """Read ``plugin/expected.toml``."""
        tomllib = pytest.importorskip(
            "tomllib" if sys.version_info >= (3, 11) else "tomli",
            reason="reading expected.toml on Python 3.10 needs tomli: pip install tomli",
        )
        data = tomllib.loads((plugin / "expected.toml").read_text())
        return cls(
            must_keep=tuple(data["must_keep"]),
            must_move=tuple(data["must_move"]),
            todo_mentions=tuple(data["todo_mentions"]),
            left_alone=tuple(data["left_alone"]),
            unchanged=bool(data["unchanged"]),
            advised=bool(data.get("advised", True)),
        )


@dataclass(frozen=True)
class Migration:
    """One plugin migrated into a copy."""

    plugin: Path
    copy: Path
    report: str
    """The migration's stdout and stderr together (summary, ``todo:`` and ``review:`` lines)."""


def copy_plugin(plugin: Path, into: Path) -> Path:
    """A copy of ``plugin`` under ``into``, without byte-code."""
    copy = into / plugin.name
    shutil.copytree(plugin, copy, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return copy


def run_plugin_tests(plugin: Path) -> subprocess.CompletedProcess[str]:
    """The plugin's own tests, with the stand-in and the plugin on the path and nothing of this repository."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(LEGACY_API), str(plugin)]),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", os.devnull]
    command += ["--rootdir", str(plugin), "--confcutdir", str(plugin), "tests"]
    return subprocess.run(command, cwd=plugin, env=env, capture_output=True, text=True, timeout=300)


def migrate(path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """``cudagraph-migrate PATH --no-progress -j 1``, as installed."""
    command = [sys.executable, "-m", "cudagraph.migrate.command", str(path), "--no-progress", "-j", "1", *extra]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def migrate_in_process(path: Path, *extra: str) -> int:
    """``cudagraph-migrate PATH --no-progress -j 1`` called in this process (the ``migrated`` fixture runs the
    installed command in its own process; a second run needs only the exit status and the files)."""
    return command.main([str(path), "--no-progress", "-j", "1", *extra])


def python_files(root: Path) -> dict[Path, bytes]:
    """Every Python file under ``root``, by path relative to it."""
    return {path.relative_to(root): path.read_bytes() for path in sorted(root.rglob("*.py"))}


def migration_diff(migration: Migration) -> str:
    """What the migration changed, as a unified diff (for failure messages)."""
    before, after = python_files(migration.plugin), python_files(migration.copy)
    return "".join(
        line
        for path in sorted(after)
        for line in difflib.unified_diff(
            before.get(path, b"").decode().splitlines(keepends=True),
            after[path].decode().splitlines(keepends=True),
            f"a/{path}",
            f"b/{path}",
        )
    )


def todo_comments(root: Path) -> Iterator[str]:
    """Every ``# TODO(cudagraph-migrate):`` comment under ``root``, as one line."""
    for path in sorted(root.rglob("*.py")):
        yield from file_todo_comments(path)


def file_todo_comments(path: Path) -> Iterator[str]:
    """Every ``# TODO(cudagraph-migrate):`` comment of one file, its wrapped lines (``#   ...`` below it) joined."""
    comment: str | None = None
    for line in path.read_text().splitlines():
        text = line.strip()
        if comment is not None and text.startswith(CONTINUATION) and text[len(CONTINUATION) :].strip():
            comment = f"{comment} {text[len(CONTINUATION) :].strip()}"
            continue
        if comment is not None:
            yield comment
        comment = text if text.startswith(TODO) else None
    if comment is not None:
        yield comment


@pytest.fixture(scope="module", params=PLUGINS, ids=lambda path: path.name)
def migrated(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Migration:
    plugin: Path = request.param
    copy = copy_plugin(plugin, tmp_path_factory.mktemp(plugin.name))
    result = migrate(copy)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return Migration(plugin, copy, result.stdout + result.stderr)


# --- the proof ---


def test_the_corpus_has_every_plugin_complete() -> None:
    assert len(PLUGINS) >= 5, PLUGINS
    for plugin in PLUGINS:
        packages = [path for path in plugin.iterdir() if (path / "__init__.py").is_file()]
        assert packages and (plugin / "README.md").is_file() and (plugin / "expected.toml").is_file(), plugin
        assert list((plugin / "tests").glob("test_*.py")), plugin


# The corpus's own check (each plugin's tests pass against the stand-in as written): a pytest process a plugin, so
# `nox -s slow` runs it; `nox -s tests` keeps the proof, the same tests after migration.
@pytest.mark.slow
@pytest.mark.parametrize("plugin", PLUGINS, ids=lambda path: path.name)
def test_the_plugin_tests_pass_before_migration(plugin: Path, tmp_path: Path) -> None:
    result = run_plugin_tests(copy_plugin(plugin, tmp_path))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-1000:]


def after_migration_cases() -> list[object]:
    """Every plugin, for the proof after migration; where the migration must leave the plugin's Python unchanged
    (``unchanged`` in its ``expected.toml``, checked by ``test_each_plugin_gets_the_outcome_it_models``), its tests
    after are its tests before, so that run is ``slow`` with the run before."""
    return [
        pytest.param(plugin, id=plugin.name, marks=[pytest.mark.slow] if Expectation.of(plugin).unchanged else [])
        for plugin in PLUGINS
    ]


@pytest.mark.parametrize("migrated", after_migration_cases(), indirect=True)
def test_the_plugin_tests_pass_after_migration(migrated: Migration) -> None:
    result = run_plugin_tests(migrated.copy)
    assert result.returncode == 0, (
        result.stdout[-3000:] + "\nthe migration's diff:\n" + migration_diff(migrated)[-3000:]
    )


def _kept_by_its_import(place: Place) -> bool:
    """A call of a legacy name whose import carries the TODO that keeps that name (``X stays on ...``): the TODO
    marks the name once, where it could not move, rather than at every call."""
    if not place.what.startswith("call of legacy "):
        return False
    name = place.what.rpartition(".")[2]
    return any(f" {name} stays on " in comment for comment in file_todo_comments(place.path))


def test_every_legacy_place_left_carries_a_todo(migrated: Migration) -> None:
    legacy, _ = PluginCode(migrated.copy).places()
    unmarked = [str(place) for file, place in legacy if not file.marked(place) and not _kept_by_its_import(place)]
    assert unmarked == [], "legacy places without a TODO:\n" + "\n".join(unmarked)


def test_every_option_of_another_program_is_named(migrated: Migration) -> None:
    _, options = PluginCode(migrated.copy).places()
    unnamed = [
        str(place)
        for file, place in options
        if not file.marked(place)
        and not named_lines(migrated.report, place.path) & set(range(place.first_line, place.last_line + 1))
    ]
    assert unnamed == [], "options of another program the report does not name:\n" + "\n".join(unnamed)


def test_the_summary_counts_the_todos(migrated: Migration) -> None:
    # The wording is the report's own. Assumed only: a summary line (one naming no file of the copy) mentions
    # "TODO" or "manual" with the count as its first number, and that count is at least the comments written (one
    # comment may mark several findings on one statement).
    written = len(list(todo_comments(migrated.copy)))
    summary = [
        line
        for line in migrated.report.splitlines()
        if ("TODO" in line or "manual" in line.lower()) and str(migrated.copy) not in line
    ]
    counts = [int(numbers[0]) for numbers in (re.findall(r"\b\d+\b", line) for line in summary) if numbers]
    assert counts, migrated.report[-2000:]
    assert max(counts) >= written


def test_a_second_run_changes_nothing(migrated: Migration, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    again = copy_plugin(migrated.copy, tmp_path)
    assert migrate_in_process(again) == 0, capsys.readouterr().err[-2000:]
    assert python_files(again) == python_files(migrated.copy)
    check = migrate_in_process(again, "--check")
    assert check == 0, "\n".join(capsys.readouterr())[-3000:]


def test_each_plugin_gets_the_outcome_it_models(migrated: Migration) -> None:
    expected = Expectation.of(migrated.plugin)
    code = PluginCode(migrated.copy)
    plugin_files = [file for file in code.files if "tests" not in file.path.relative_to(migrated.copy).parts]
    imported = {
        alias.asname or alias.name: node.module or ""
        for file in plugin_files
        for node in ast.walk(file.tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    for name in expected.must_keep:
        assert imported.get(name) in LEGACY.modules, f"{name} should stay on the legacy API"
    for name in expected.must_move:
        module = imported.get(name, "")
        assert module.startswith("cudagraph.") and not module.startswith("cudagraph.legacy"), f"{name}: {module}"
    todos = "\n".join(todo_comments(migrated.copy))
    assert [mention for mention in expected.todo_mentions if mention not in todos] == []
    for line in expected.left_alone:
        found = [
            (file, index + 1) for file in plugin_files for index, text in enumerate(file.lines) if text.strip() == line
        ]
        assert found, f"{line!r} should be left as written"
        assert not [file for file, number in found if file.marked(Place(file.path, number, number, line))], line
    if expected.unchanged:
        assert python_files(migrated.copy) == python_files(migrated.plugin)
    if not expected.advised:
        advice = [line for line in migrated.report.splitlines() if line.startswith("todo:") or "add_cli_args" in line]
        assert advice == [] and not list(todo_comments(migrated.copy)), advice


# --- the reading itself can fail: it finds what it should in code written for it ---

READING_CASE = '''\
import sglang
from sglang.srt.model_executor.cuda_graph_runner import CudaGraphRunner
from sglang.srt.model_executor.model_runner import ModelRunner
from sglang.srt.server_args import ServerArgs


class Platform(CudaGraphRunner):
    def capture_one_batch_size(self, bs, forward):
        return super().capture_one_batch_size(bs, forward)


class Own:
    def capture_one_batch_size(self, bs):
        return self.graph_runner


class Engine(ModelRunner):
    def init_device_graphs(self):
        return self.graph_runner


def build(model_runner: ModelRunner, args: ServerArgs):
    runner = CudaGraphRunner(model_runner)
    model_runner.init_device_graphs()
    if args.disable_cuda_graph or model_runner.server_args.cuda_graph_max_bs:
        launch("python -m sglang.launch_server --cuda-graph-bs 1 2")
    return runner, ServerArgs(cuda_graph_bs=[1]), sglang.Engine(disable_cuda_graph=True), ["--disable-cuda-graph"]


def launch(command):
    """Runs ``--cuda-graph-bs 1`` style commands."""
    return command
'''


def test_the_reading_finds_the_legacy_places_and_only_those(tmp_path: Path) -> None:
    (tmp_path / "case.py").write_text(READING_CASE)
    legacy, options = PluginCode(tmp_path).places()
    assert sorted({place.first_line for _, place in legacy}) == [2, 7, 8, 9, 18, 19, 23, 24]
    assert sorted({place.first_line for _, place in options}) == [25, 26, 27]
    assert len(options) == 6


READING_DICTS_CASE = """\
import sglang
from sglang.srt.entrypoints.http_server import ServerArgs

KWARGS = dict(disable_cuda_graph=True, model_path="m")


def build(cfg, **kwargs):
    args = {"cuda_graph_bs": [1, 2], "model_path": cfg.model}
    kwargs.setdefault("cuda_graph_max_bs", 8)
    kwargs["piecewise_cuda_graph_max_tokens"] = kwargs.pop("max_tokens")
    return ServerArgs(**args), sglang.Engine(**KWARGS), sglang.Engine(**kwargs), print(**kwargs)
"""


def test_the_reading_finds_sglangs_options_in_dicts_and_their_splats(tmp_path: Path) -> None:
    (tmp_path / "case.py").write_text(READING_DICTS_CASE)
    _, options = PluginCode(tmp_path).places()
    assert sorted((place.first_line, place.what.partition(" (")[0]) for _, place in options) == [
        (4, "disable_cuda_graph= in dict(...)"),
        (8, "dict key 'cuda_graph_bs'"),
        (9, "setdefault('cuda_graph_max_bs')"),
        (10, "['piecewise_cuda_graph_max_tokens']"),
        (11, "**KWARGS"),
        (11, "**args"),
        (11, "**kwargs"),
    ]
    # a file that imports nothing of SGLang's has no such places: the keys are another program's
    (tmp_path / "case.py").write_text(READING_DICTS_CASE.replace("import sglang\n", "").replace("sglang.", "own."))
    (tmp_path / "case.py").write_text((tmp_path / "case.py").read_text().replace("from own.srt", "from own_srt"))
    assert PluginCode(tmp_path).places()[1] == []


def test_a_todo_marks_its_statement_from_above_or_on_it(tmp_path: Path) -> None:
    source = (
        f"x = 1\n{TODO} a\n# more\nfrom sglang.srt.model_executor.cuda_graph_runner import (\n    A,\n)  {TODO} b\n"
    )
    (tmp_path / "case.py").write_text(source)
    file = SourceFile.read(tmp_path / "case.py", tmp_path)
    assert file.marked(Place(file.path, 4, 6, "import"))
    assert not file.marked(Place(file.path, 1, 1, "x"))
    assert file.marked(Place(file.path, 6, 6, "trailing"))


def test_a_wrapped_todo_is_read_as_one_comment(tmp_path: Path) -> None:
    path = tmp_path / "case.py"
    path.write_text(f"{TODO} a long\n#   message — see\n    #   guide\n# not a continuation\nx = 1\n{TODO} b\n")
    assert list(file_todo_comments(path)) == [f"{TODO} a long message — see guide", f"{TODO} b"]


MAYBE_READING_CASE = """\
import dataclasses

from sglang.srt.model_executor.model_runner import ModelRunner


@dataclasses.dataclass(frozen=True)
class LaunchConfig:
    cuda_graph_max_bs: int = 8
    tensor_parallel_size: int = 1


class Wrapper:
    def __init__(self, model_runner: ModelRunner):
        self.model_runner = model_runner


def use(wrapper: Wrapper, model_runner: ModelRunner):
    wrapper.model_runner.init_device_graphs()
    ready = getattr(wrapper.model_runner, "graph_runner", None)
    typed = hasattr(model_runner, "piecewise_cuda_graph_runner")
    own = getattr(wrapper, "tensor_parallel_size", None)
    return ready, typed, own
"""


def test_the_reading_finds_places_maybe_tied_to_sglang_and_only_where_sglang_is_imported(tmp_path: Path) -> None:
    (tmp_path / "case.py").write_text(MAYBE_READING_CASE)
    legacy, named = PluginCode(tmp_path).places()
    assert sorted(place.first_line for _, place in legacy) == [20]  # typed with SGLang's ModelRunner
    assert sorted(place.first_line for _, place in named) == [8, 18, 19]  # a field, two unknown receivers
    (tmp_path / "case.py").write_text(
        MAYBE_READING_CASE.replace("from sglang.srt.model_executor.model_runner", "from x")
    )
    legacy, named = PluginCode(tmp_path).places()
    assert legacy == [] and named == []
