"""What every rule shares: the libcst codemod base class, edit counting and the legacy-module matcher."""

from __future__ import annotations

import ast
import enum
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import PurePath
from typing import TypeVar

import libcst as cst
from libcst.codemod import CodemodCommand, CodemodContext
from libcst.codemod.visitors import AddImportsVisitor
from libcst.metadata import MetadataWrapper

from ..exports import ExportsManifest, load_exports
from ..line_moves import moved_lines
from ..metadata import positions, resolved
from ..renames import Rename, RenameTable
from ..table_cache import per_table
from ..todo_comments import GuideSection, todo_text, todos_in, with_todo_comments, without_todos


class FindingKind(str, enum.Enum):
    """What a finding tells the user."""

    TODO = "todo"
    """A legacy use left as written that needs a manual step: a ``# TODO(cudagraph-migrate): ...`` comment marks it in
    the file and the summary counts it under "needs a manual step". Only :meth:`MigrationCommand.note`, which writes
    that comment, makes one: what the tool finds without marking it in the file is listed for review instead."""
    SKIP = "skip"
    """A same-spelled name left alone because nothing ties it to the legacy API (listed with ``-v``)."""
    ARGV = "argv"
    """Another program's option, listed for review: a legacy flag in a command line (rewritten only with
    ``--rewrite-argv``), a legacy keyword or attribute of another engine's ``ServerArgs``/``Engine`` (rewritten only
    with ``--rewrite-engine-options``), or a program's own definition of a legacy flag (never rewritten)."""
    MAYBE = "maybe"
    """A place in a file tied to a legacy engine (:func:`ties_to_legacy_engine`) that may reach its API but could not
    be tied to it: a legacy member used on a receiver of unknown type, a config field named like a legacy option, a
    subclass that moved onto a new class its builders (out of the file's sight) may still build the legacy way.
    Listed for review with the new spelling, never rewritten nor marked."""


@dataclass(frozen=True)
class Finding:
    """One thing a rule reports about a file: its kind, the rule, the line (0 if unknown) and the message."""

    kind: FindingKind
    code: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.code} {self.line}: {self.message}" if self.line else f"{self.code} {self.message}"


@dataclass
class QuickView:
    """A file as :mod:`ast` sees it, for the rules' cheap checks before any libcst work."""

    tree: ast.Module
    text: str
    path: str
    table: RenameTable
    rewrite_argv: bool
    imported: frozenset[str]
    """Canonical qualified names the file imports: ``module.Name`` of from-imports, and imported modules."""
    rewrite_engine_options: bool = False
    """Whether other engines' legacy Python options are to be rewritten (``--rewrite-engine-options``)."""

    def reaches_any(self, owners: Sequence[str]) -> bool:
        """Whether an owner, or the module that defines it, is imported here."""
        return any(owner in self.imported or owner.rpartition(".")[0] in self.imported for owner in owners)

    @property
    def tied_to_legacy_engine(self) -> bool:
        """Whether the file imports a legacy engine (:func:`ties_to_legacy_engine`)."""
        return ties_to_legacy_engine(self.imported, self.table)


def ties_to_legacy_engine(imported: Iterable[str], table: RenameTable) -> bool:
    """Whether a file that imports ``imported`` (qualified names, as :attr:`QuickView.imported` holds them) is tied to
    a legacy engine: it imports from one of that engine's packages (``sglang``, ``pymllm``: the packages of the legacy
    modules and legacy owners of ``table``). The ``cudagraph.legacy`` shims do not count: their objects are ours.

    The one definition of "a file tied to SGLang": where a rule cannot tie a place to the legacy API but the file
    reaches that engine, the place is listed for review (:attr:`FindingKind.MAYBE`) rather than passed over.
    """
    roots = _legacy_engine_roots(table)
    return any(name.partition(".")[0] in roots for name in imported)


@per_table
def _import_spellings(table: RenameTable) -> frozenset[str]:
    """Text an import of a legacy module contains: the module path (``import a.b.c``), or its package when the module
    is imported from it (``from a.b import c``); and the modules of the legacy engine's classes that own members."""
    # a module the legacy engine still ships is legacy only beside a retired one, whose spelling is here already
    retired = [module for module, row in table.modules.items() if not row.still_shipped]
    packages = {module.rpartition(".")[0] for module in retired}
    owner_modules = {owner.rpartition(".")[0] for row in table for owner in row.legacy_owners}
    return frozenset({*retired, *(package for package in packages if package), *owner_modules})


@per_table
def _legacy_engine_roots(table: RenameTable) -> frozenset[str]:
    """The top-level packages of the legacy engines (``sglang``, ``pymllm``): never ``cudagraph``."""
    names = {*table.modules, *(owner for row in table for owner in row.legacy_owners)}
    return frozenset(root for name in names if (root := name.partition(".")[0]) != "cudagraph")


class MigrationCommand(CodemodCommand, cst.CSTTransformer):
    """A libcst codemod driven by the rename table that counts its edits and collects notes for the user.

    A ``CodemodCommand`` (context, metadata, the add-imports pass) visiting as a plain ``CSTTransformer``: the rules
    use no matcher decorators, and libcst's matcher-aware transformer costs several times a plain visit per file.

    Subclasses call :meth:`edited` once per rewritten occurrence, :meth:`note` where a legacy use was found but
    could not be rewritten safely (it stays as written and the user is told where), :meth:`skip` where a
    same-spelled name could not be tied to the legacy API (left alone; listed with ``-v``), and :meth:`candidate`
    for a place listed for review (another program's option, which only an opt-in flag rewrites, or a flag
    definition).
    """

    CODE = ""
    """The rule code findings are reported under (set by the rule table)."""

    DESCRIPTION = "Rewrite legacy CUDA-graph names."

    def __init__(self, context: CodemodContext, table: RenameTable, exports: ExportsManifest | None = None) -> None:
        CodemodCommand.__init__(self, context)
        self.table = table
        self.exports = exports if exports is not None else load_exports()
        self.edits = 0
        self.findings: list[Finding] = []
        self._pending: list[tuple[cst.CSTNode | None, FindingKind, str]] = []
        self.comments_added = 0
        """``# TODO(cudagraph-migrate)`` comments this rule wrote (a file can change by comments alone)."""
        self._todo_stack: list[list[str]] = []
        """Per statement being visited (innermost last): the TODO comments due above it."""
        self._todo_by_node: dict[int, list[str]] = {}
        """TODO comments noted before the visit reached their node (planning passes), by node id."""

    TIED_TO_OWNERS = False
    """Whether the rule only rewrites what is tied to the legacy API, which a file can only reach through an import
    of an owner or its module: where it can reach none, the rule lists what it leaves alone from the :mod:`ast` tree
    (:meth:`same_spelled`) and libcst is never run for it."""

    @classmethod
    def triggers(cls, table: RenameTable) -> frozenset[str]:
        """Text of which at least one must occur in a file for this rule to have anything to do there.

        A rule tied to owners is triggered by the texts of its rows (:meth:`owners_by_trigger`); others say theirs.
        """
        by_trigger = cls.owners_by_trigger(table)
        if not by_trigger:
            raise NotImplementedError(f"{cls.__name__} must say which text triggers it")
        return frozenset(by_trigger)

    @classmethod
    def quick_findings(cls, view: QuickView) -> list[Finding] | None:
        """The rule's findings read off the :mod:`ast` tree when it certainly rewrites nothing, else ``None``.

        A rule that has nothing to rewrite in a file skips libcst altogether (its scope analysis and a full
        transform of a large file cost seconds where :mod:`ast` costs milliseconds). The default: a rule tied to
        owners has nothing to do where no owner of a row whose name occurs in the file can be imported: it lists the
        same-spelled names it leaves alone there (:meth:`same_spelled`), read off the :mod:`ast` tree.
        """
        if not cls.TIED_TO_OWNERS:
            return None
        for trigger, owners in cls.owners_by_trigger(view.table).items():
            if trigger in view.text and view.reaches_any(owners):
                return None
        return cls.same_spelled(view)

    @classmethod
    def same_spelled(cls, view: QuickView) -> list[Finding]:
        """For a rule tied to owners, in a file that can reach none of them: every place spelled like one of its rows,
        each a :attr:`FindingKind.SKIP` (or, where the file is tied to a legacy engine and the place may reach it,
        :attr:`FindingKind.MAYBE`), with the message the libcst visit would give it."""
        return []

    @classmethod
    def owners_by_trigger(cls, table: RenameTable) -> dict[str, tuple[str, ...]]:
        """For a rule tied to owners: each text that triggers a row, and that row's owners."""
        return {}

    @classmethod
    def applies(cls, text: str, path: str, table: RenameTable, markers: frozenset[str] = frozenset()) -> bool:
        """The cheap text prefilter: whether this rule could have anything to do in ``text`` (the file at ``path``).

        That is whether one of its triggers occurs: a rule tied to owners that can reach none here still lists the
        same-spelled names it leaves alone (from the :mod:`ast` tree, see :meth:`quick_findings`). ``markers`` (the
        last parts of the project's modules that re-export legacy names, through which a file can reach the legacy
        API too) change nothing here; they are the signature every rule shares.
        """
        return any(trigger in text for trigger in _triggers(cls, table))

    @classmethod
    def prefilter_texts(cls, table: RenameTable) -> frozenset[str]:
        """Texts of which every file this rule :meth:`applies` to holds at least one: the run's prefilter
        (:func:`cudagraph.migrate.rules.rule_prefilter`) keeps every file holding one. Its triggers, unless
        :meth:`applies` reads more than them."""
        return cls.triggers(table)

    def edited(self, count: int = 1) -> None:
        """Record ``count`` rewritten occurrences."""
        self.edits += count

    def note(self, node: cst.CSTNode | None, message: str, section: GuideSection = GuideSection.MANUAL_STEPS) -> None:
        """Record a legacy use left as written that needs a manual step, and mark it in the file.

        The finding's line is looked up once the rule has finished; a ``# TODO(cudagraph-migrate)`` comment naming
        ``message`` and ``cudagraph-migrate --explain`` with this rule's code goes above the statement that holds
        ``node`` (see :mod:`cudagraph.migrate.todo_comments`). ``section`` is the guide's section that says how to do
        the step: one of those ``--explain`` prints for this rule (:data:`cudagraph.migrate.guide.RULE_SECTIONS`).
        Called while this rule visits ``node`` (from its ``visit_``/``leave_`` methods), or before the visit starts (a
        planning pass); ``node`` None records the finding only.
        """
        self._pending.append((node, FindingKind.TODO, message))
        if node is None:
            return
        text = todo_text(message, self.CODE)
        if self._todo_stack:
            self._todo_stack[-1].append(text)
        else:
            self._todo_by_node.setdefault(id(node), []).append(text)

    @property
    def has_planned_comments(self) -> bool:
        """Whether a planning pass noted places that the visit still has to mark."""
        return bool(self._todo_by_node)

    @property
    def planned_comment_ids(self) -> Collection[int]:
        """Ids of the nodes a planning pass noted, which the visit has to reach to mark them."""
        return self._todo_by_node.keys()

    def on_visit(self, node: cst.CSTNode) -> bool:
        """Open a statement's list of due TODO comments, then dispatch to ``visit_<Node>``."""
        if type(node) in _STATEMENTS:
            self._todo_stack.append([])
        return super().on_visit(node)

    def on_leave(  # type: ignore[override]
        self, original_node: cst.CSTNode, updated_node: cst.CSTNode
    ) -> cst.CSTNode | cst.RemovalSentinel | cst.FlattenSentinel[cst.CSTNode]:
        """Dispatch to ``leave_<Node>``, then write the TODO comments due above a statement being left."""
        result = super().on_leave(original_node, updated_node)
        if type(original_node) is cst.Module and isinstance(result, cst.Module):
            return self._without_header_duplicates(result)
        planned = self._todo_by_node.pop(id(original_node), None) if self._todo_by_node else None
        if planned and self._todo_stack:
            self._todo_stack[-1].extend(planned)
        if type(original_node) not in _STATEMENTS:
            return result
        due = self._todo_stack.pop()
        if not due:
            return result
        if isinstance(result, cst.FlattenSentinel) and result.nodes:
            first, added = with_todo_comments(result.nodes[0], due)
            self.comments_added += added
            return cst.FlattenSentinel([first, *result.nodes[1:]])
        if isinstance(result, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
            marked, added = with_todo_comments(result, due)
            self.comments_added += added
            return marked
        if self._todo_stack:  # the statement went away: the comment goes above the one that held it
            self._todo_stack[-1].extend(due)
        return result

    def skip(self, node: cst.CSTNode | None, message: str) -> None:
        """Record a same-spelled name left alone because nothing ties it to the legacy API."""
        self._pending.append((node, FindingKind.SKIP, message))

    def maybe(self, node: cst.CSTNode | None, message: str) -> None:
        """Record a place that may reach a legacy engine's API but could not be tied to it (listed for review)."""
        self._pending.append((node, FindingKind.MAYBE, message))

    def candidate(self, node: cst.CSTNode | None, message: str) -> None:
        """Record a place listed for review: another program's option (a legacy flag in its command line, rewritten
        only with ``--rewrite-argv``), or a program's own definition of a legacy flag (never rewritten)."""
        self._pending.append((node, FindingKind.ARGV, message))

    def _without_header_duplicates(self, module: cst.Module) -> cst.Module:
        """libcst parses comments above a file's first statement as the module's header: a TODO already there is not
        written again above that statement."""
        if not module.body or not module.header:
            return module
        first = module.body[0]
        in_header = todos_in([line.comment.value if line.comment is not None else None for line in module.header])
        kept, dropped = without_todos(first.leading_lines, in_header)
        if not dropped:
            return module
        self.comments_added -= dropped
        return module.with_changes(body=[first.with_changes(leading_lines=kept), *module.body[1:]])

    def transform_module_impl(self, tree: cst.Module) -> cst.Module:
        """Visit the whole module with this rule's ``visit_``/``leave_`` methods."""
        return tree.visit(self)

    def transform_module(self, tree: cst.Module) -> cst.Module:
        """Run this rule on ``tree`` with its metadata, then add any imports it asked for.

        Unlike libcst's default this does not deep-copy the tree for the metadata wrapper: a copy per rule per file
        cost as much as the rewrite itself. That is safe because every rule receives a tree in which no node object
        occurs twice (fresh from the parser, or rewritten by an earlier rule that builds new nodes and keeps each
        node it does not visit in its one place; the rules that expand one item into several give each its own
        copy). A rule that edits nothing hands the very same tree on, so the next rule reuses the metadata already
        computed for it (one scope analysis serves every scoped rule of a file whose imports did not change). The
        metadata comes from :mod:`cudagraph.migrate.metadata`, which spares libcst's walks that compute nothing.
        """
        wrapper = _shared_wrapper(self.context, tree)
        with resolved(self, wrapper):
            self.context = replace(self.context, wrapper=wrapper)
            transformed = self.transform_module_impl(wrapper.module)
        self._resolve_notes(wrapper)
        if not self.edits and not self.comments_added:
            return tree
        if self.context.scratch.get(AddImportsVisitor.CONTEXT_KEY):
            transformed = AddImportsVisitor(self.context).transform_module(transformed)
        return transformed

    def _resolve_notes(self, wrapper: MetadataWrapper) -> None:
        if not self._pending:
            return
        lines = self._lines_by_search(wrapper)
        if lines is None:  # the cheap way could not place every node: positions of the whole tree
            where = positions(wrapper)
            lines = self._on_original_lines(
                wrapper,
                {
                    id(node): position.start.line
                    for node, _, _ in self._pending
                    if node is not None and (position := where.get(node)) is not None
                },
            )
        for node, kind, message in self._pending:
            self.findings.append(Finding(kind, self.CODE, lines.get(id(node), 0), message))
        self._pending.clear()

    def _on_original_lines(self, wrapper: MetadataWrapper, lines: dict[int, int]) -> dict[int, int]:
        """``lines`` of ``wrapper.module`` as lines of the file's own text: an earlier rule may have rewritten the tree
        this rule read, and the TODO comments it wrote there push everything below them down."""
        original = self.context.scratch.get(ORIGINAL_KEY)
        if not lines or not isinstance(original, tuple) or original[0] is wrapper.module:
            return lines
        moved = moved_lines(wrapper.module.code.splitlines(), str(original[1]).splitlines())
        return {key: moved.get(line, line) for key, line in lines.items()}

    def _lines_by_search(self, wrapper: MetadataWrapper) -> dict[int, int] | None:
        """Lines of the pending nodes found by their code in the file's own text, or None where that is ambiguous.

        Positions of the whole tree cost a second code generation pass; a node whose code occurs exactly once in the
        unmodified source is placed by a text search instead (valid only while the tree is still the parsed one).
        """
        original = self.context.scratch.get(ORIGINAL_KEY)
        if not isinstance(original, tuple) or original[0] is not wrapper.module:
            return None
        text: str = original[1]
        lines: dict[int, int] = {}
        for node, _, _ in self._pending:
            if node is None:
                continue
            code = _EMPTY_MODULE.code_for_node(node).strip()
            start = text.find(code) if code else -1
            if start < 0 or text.find(code, start + 1) >= 0:
                return None
            lines[id(node)] = text.count("\n", 0, start) + 1
        return lines


_STATEMENTS = frozenset(
    {
        cst.SimpleStatementLine,
        cst.FunctionDef,
        cst.ClassDef,
        cst.If,
        cst.For,
        cst.While,
        cst.Try,
        cst.TryStar,
        cst.With,
        cst.Match,
    }
)
"""Nodes a TODO comment can stand above (their ``leading_lines``), by exact type: this is checked on every node of
every visit, where an ``isinstance`` against libcst's abstract bases costs seconds over a large tree."""

_WRAPPER_KEY = "cudagraph.migrate.metadata_wrapper"
ORIGINAL_KEY = "cudagraph.migrate.original"
"""``CodemodContext.scratch`` key: ``(parsed tree, its source text)`` of the file being migrated."""
MOVE_SHARED_STATE_KEY = "cudagraph.migrate.move_shared_state"
"""``CodemodContext.scratch`` key: true when names sharing state with a legacy runner may move (``shared_state``)."""
REWRITE_ENGINE_OPTIONS_KEY = "cudagraph.migrate.rewrite_engine_options"
LEGACY_ENGINE_FILE_KEY = "cudagraph.migrate.legacy_engine_file"
"""``CodemodContext.scratch`` key: true when the file is tied to a legacy engine (:func:`ties_to_legacy_engine`)."""
"""``CodemodContext.scratch`` key: true when other engines' legacy Python options are to be rewritten."""
_EMPTY_MODULE = cst.Module([])


def original_source(context: CodemodContext, tree: cst.Module) -> tuple[cst.Module, str | None]:
    """The file being migrated as written (its parsed tree and text), where the run recorded it; else ``tree``: an
    earlier rule may already have rewritten ``tree``'s imports."""
    original = context.scratch.get(ORIGINAL_KEY)
    if isinstance(original, tuple) and isinstance(original[0], cst.Module):
        return original[0], str(original[1])
    return tree, None


@per_table
def _triggers(command: type[MigrationCommand], table: RenameTable) -> tuple[str, ...]:
    """``command.triggers(table)``, computed once per table (the prefilter asks for them on every file)."""
    return tuple(command.triggers(table))


def _shared_wrapper(context: CodemodContext, tree: cst.Module) -> MetadataWrapper:
    """The metadata wrapper of ``tree``, reused while the rules pass the same tree object along."""
    cached = context.scratch.get(_WRAPPER_KEY)
    if isinstance(cached, MetadataWrapper) and cached.module is tree:
        return cached
    wrapper = MetadataWrapper(tree, unsafe_skip_copy=True)
    context.scratch[_WRAPPER_KEY] = wrapper
    return wrapper


@dataclass(frozen=True)
class LegacyModuleMatch:
    """A dotted name that starts at a legacy module: its row and the dotted parts after it."""

    row: Rename
    rest: tuple[str, ...]


class LegacyModuleMatcher:
    """Find legacy modules in dotted names, absolute or relative to the file being migrated.

    Relative imports are resolved against the file's own directory parts, and then match a legacy module by its
    trailing components, so a vendored copy (``third_party/sglang/srt/model_executor/x.py`` doing
    ``from .cuda_graph_runner import ...``) is recognised wherever it was vendored.
    """

    def __init__(self, table: RenameTable, filename: str | None, *, skip: Collection[str] = ()) -> None:
        self.table = table
        self.package_parts: tuple[str, ...] = PurePath(filename).parent.parts if filename else ()
        self._by_parts = sorted(
            ((tuple(old.split(".")), row) for old, row in table.modules.items() if old not in skip),
            key=lambda item: -len(item[0]),
        )

    def for_file(self, tree: cst.Module, text: str | None = None) -> LegacyModuleMatcher:
        """This matcher for the file ``tree`` (its source ``text``, where known): a module the legacy engine still
        ships (``still_shipped``) counts as legacy only where the file also imports a retired legacy module;
        elsewhere it is that engine's current API.
        """
        shipped = {old for old, row in self.table.modules.items() if row.still_shipped}
        if text is not None and not any(old.rpartition(".")[2] in text for old in shipped):
            return self  # the file names no such module: nothing to tell apart, and no walk over its statements
        finder = _RetiredImports(self)
        tree.visit(finder)
        if not shipped or finder.found:
            return self
        skipping = LegacyModuleMatcher(self.table, None, skip=shipped)
        skipping.package_parts = self.package_parts
        skipping.current_api_imports = tuple(finder.shipped)
        return skipping

    current_api_imports: tuple[tuple[cst.CSTNode, str], ...] = ()
    """Imports of still-shipped legacy modules that this file's matcher leaves alone (the file imports no retired
    legacy module), each with that module: they are the legacy engine's current API there."""

    def resolve_relative(self, level: int, dotted: str) -> tuple[str, ...]:
        """The parts of a relative name ``level`` dots up from the file's package (level 1 is the package itself)."""
        base = self.package_parts[: len(self.package_parts) - (level - 1)] if level > 1 else self.package_parts
        return (*base, *(part for part in dotted.split(".") if part))

    def match(self, dotted: str, *, level: int = 0) -> LegacyModuleMatch | None:
        """The legacy module ``dotted`` starts with (or, when relative, ends its resolved package path with)."""
        if level == 0 and dotted.startswith("."):
            level = len(dotted) - len(dotted.lstrip("."))
            dotted = dotted[level:]
        if level:
            return self._match_relative(self.resolve_relative(level, dotted))
        parts = tuple(dotted.split("."))
        for module_parts, row in self._by_parts:
            if parts[: len(module_parts)] == module_parts:
                return LegacyModuleMatch(row, parts[len(module_parts) :])
        return None

    def _match_relative(self, parts: Sequence[str]) -> LegacyModuleMatch | None:
        # Try every split point: the legacy module is the longest tail of the prefix parts[:end].
        for end in range(len(parts), 0, -1):
            prefix = tuple(parts[:end])
            for module_parts, row in self._by_parts:
                if len(prefix) >= len(module_parts) and prefix[-len(module_parts) :] == module_parts:
                    return LegacyModuleMatch(row, tuple(parts[end:]))
        return None


_WHERE_IMPORTS_ARE = (
    cst.Module,
    cst.BaseSuite,
    cst.BaseCompoundStatement,
    cst.SimpleStatementLine,
    cst.Else,
    cst.ExceptHandler,
    cst.Finally,
    cst.Import,
    cst.ImportFrom,
)


class _RetiredImports(cst.CSTVisitor):
    """Look through the statements (not into expressions) for an import of a retired legacy module, and collect the
    imports of still-shipped ones."""

    def __init__(self, matcher: LegacyModuleMatcher) -> None:
        super().__init__()
        self.matcher = matcher
        self.found = False
        self.shipped: list[tuple[cst.CSTNode, str]] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        return isinstance(node, _WHERE_IMPORTS_ARE) and super().on_visit(node)

    def visit_Import(self, node: cst.Import) -> None:
        self.found = self.found or any(self._retired(node, str(dotted_name(alias.name)), 0) for alias in node.names)

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        module = dotted_name(node.module) if node.module is not None else ""
        level = len(node.relative)
        names = [] if isinstance(node.names, cst.ImportStar) else node.names
        dotted = [str(module or "")] + [
            f"{module}.{dotted_name(alias.name)}" if module else str(dotted_name(alias.name)) for alias in names
        ]
        self.found = self.found or any(self._retired(node, path, level) for path in dotted if path or level)

    def _retired(self, node: cst.CSTNode, dotted: str, level: int) -> bool:
        match = self.matcher.match(dotted, level=level)
        if match is not None and match.row.still_shipped and all(seen is not node for seen, _ in self.shipped):
            self.shipped.append((node, match.row.old))
        return match is not None and not match.row.still_shipped


def dotted_name(node: cst.BaseExpression) -> str | None:
    """``a.b.c`` for a Name/Attribute chain, else ``None``."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        head = dotted_name(node.value)
        return f"{head}.{node.attr.value}" if head is not None else None
    return None


def dotted_expression(dotted: str) -> cst.Name | cst.Attribute:
    """The Name/Attribute chain spelling ``dotted``."""
    head, *tail = dotted.split(".")
    expression: cst.Name | cst.Attribute = cst.Name(head)
    for part in tail:
        expression = cst.Attribute(value=expression, attr=cst.Name(part))
    return expression


ItemT = TypeVar("ItemT", cst.Arg, cst.BaseElement)

_PLAIN_COMMA = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))


def splice(items: Sequence[ItemT], replacements: dict[int, list[ItemT]]) -> list[ItemT]:
    """``items`` with ``items[i]`` replaced by ``replacements[i]`` (possibly none), keeping the comma layout.

    New items borrow the separator of the item they replace, so a one-per-line call stays one-per-line, and the
    sequence keeps (or keeps lacking) its trailing comma. A comment on that separator (which precedes the *next*
    item) stays after the last new item only, never between a new flag and its value.
    """
    result: list[ItemT] = []
    for index, item in enumerate(items):
        if index not in replacements:
            result.append(item)
            continue
        group = replacements[index]
        if (
            not group and result
        ):  # a dropped item: the one before it takes over its separator (the layout to what follows)
            result[-1] = result[-1].with_changes(comma=item.comma)
            continue
        between = _without_comment(item.comma) if isinstance(item.comma, cst.Comma) else _PLAIN_COMMA
        for position, new_item in enumerate(group):
            comma = item.comma if position == len(group) - 1 else between
            result.append(new_item.with_changes(comma=comma))
    if result and items:
        had_trailing = isinstance(items[-1].comma, cst.Comma)
        if not had_trailing:
            result[-1] = result[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        elif not isinstance(result[-1].comma, cst.Comma):
            result[-1] = result[-1].with_changes(comma=items[-1].comma)
    return result


def _without_comment(comma: cst.Comma) -> cst.Comma:
    """``comma`` with the same line break and indentation but no comment or blank lines after it."""
    after = comma.whitespace_after
    if isinstance(after, cst.ParenthesizedWhitespace):
        after = after.with_changes(first_line=cst.TrailingWhitespace(), empty_lines=())
    return comma.with_changes(whitespace_after=after)


def string_value(node: cst.BaseExpression) -> str | None:
    """The text of a plain (non-f, non-bytes) one-piece string literal, else ``None``."""
    if not isinstance(node, cst.SimpleString) or "b" in node.prefix.lower():
        return None
    value = node.evaluated_value
    return value if isinstance(value, str) else None


def with_string_value(node: cst.SimpleString, value: str) -> cst.SimpleString:
    """``node`` holding ``value``, in the same prefix and quotes (``value`` holds no quote or backslash)."""
    return node.with_changes(value=f"{node.prefix}{node.quote}{value}{node.quote}")
