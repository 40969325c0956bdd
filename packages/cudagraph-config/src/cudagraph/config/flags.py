"""The table of CUDA-graph command-line flags (modern, other engines' spellings, legacy) and ``add_cli_args``.

Every flag is one row. A modern row knows how to read its raw value into *claims* (settings key -> typed value). An
alias row is another engine's spelling of one modern flag (SGLang's ``--cuda-graph-backend-decode``); a legacy row
names the modern flags (and values) it stands for. Both read through the modern rows, so they resolve exactly like
their modern flags by construction. Python keyword arguments are the flags' ``dest`` names
(``--decode-cuda-graph-bs`` -> ``decode_cuda_graph_bs``).

The legacy rows are not written here: they are the ``cli_flag`` rows of ``refactor/renames.toml`` (with their
``kwarg`` twins), read at import through :mod:`.renames`. What the table cannot say, how a value is read, stays with
the modern flags the rows name.
"""

from __future__ import annotations

import argparse
import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from .memory_budget import BUDGET_EXAMPLES, read_memory_budget
from .mode_json import PHASE_OBJECT_EXAMPLE, read_mode
from .origins import OriginKind
from .renames import Rename, RenameKind, RenameTable, RenameTableError, load_renames
from .values import (
    MODE_EXAMPLE,
    Claims,
    Notes,
    read_backend,
    read_capture_policy,
    read_compiler,
    read_directory,
    read_padding_ratio,
    read_positive_int,
    read_sizes,
    read_switch,
    read_torch_compile_mode,
)
from .vllm import VLLM_CUDAGRAPH_MODES, read_compilation_config, read_enforce_eager, read_vllm_mode
from .vocabulary import (
    BACKEND_OPTIONS,
    BUCKETS_OPTIONS,
    CAPTURE_POLICY_OPTIONS,
    COMPILE_CACHE_DIR_OPTION,
    COMPILER_OPTION,
    DEFAULT_CAPTURE_POLICY,
    DEFAULT_CUDA_GRAPH_MODE,
    DEFAULT_MAX_SIZE,
    DEFAULT_TORCH_COMPILE_MAX_BS,
    DISABLE_OPTIONS,
    ENABLE_TORCH_COMPILE_OPTION,
    MAX_SIZE_OPTIONS,
    MEMORY_BUDGET_OPTIONS,
    MODE_OPTION,
    PADDING_RATIO_OPTIONS,
    SWITCH_OPTIONS,
    TC_PIECEWISE_COMPILERS,
    TORCH_COMPILE_MODE_OPTION,
    TORCH_COMPILE_MODES,
    TORCH_COMPILE_OPTION,
    Backend,
    CapturePolicy,
    Phase,
    allowed_backends,
    phase_key,
)


class Arity(enum.Enum):
    """How many command-line values a flag takes."""

    SWITCH = "switch"
    ONE = "one"
    MANY = "many"


@dataclass(frozen=True)
class _Spelling:
    """What every flag row has: the option string a user types, and the keyword it becomes."""

    option: str

    @property
    def dest(self) -> str:
        """The argparse destination, which is also the Python keyword argument name."""
        return option_dest(self.option)


@dataclass(frozen=True)
class Flag(_Spelling):
    """One modern flag: its option string, arity, precedence kind, help, and how its value becomes claims."""

    arity: Arity
    kind: OriginKind
    read: Callable[[str, object, Notes], Claims]
    """``read(label, raw, notes)``: the claims of a given value; ``label`` is the flag the user typed (for messages),
    ``notes`` collects the legacy value spellings it accepted."""
    help: str
    metavar: str | None = None


@dataclass(frozen=True)
class LegacyFlag(_Spelling):
    """A deprecated flag: an alias of one or more modern flags, each with a fixed value or the alias's own value.

    Built from a ``cli_flag`` row of the rename table by :func:`legacy_flags_from_table`, never by hand.
    """

    option: str
    arity: Arity
    replacement: tuple[tuple[str, str | None], ...]
    """``(modern option, value)`` pairs; ``None`` passes the legacy flag's own value (or switch) through."""
    deprecated_in: str
    """The cudagraph-config version that deprecated the flag (the row's ``deprecated_in``)."""
    removed_in: str
    """The cudagraph-config version that removes it (the row's ``removed_in``)."""

    @property
    def kind(self) -> OriginKind:
        """Legacy flags rank below the per-phase flags."""
        return OriginKind.LEGACY_FLAG

    def read(self, label: str, raw: object, notes: Notes) -> Claims:
        """The claims of the modern flags this alias stands for, read with the alias's name in messages."""
        if self.arity is Arity.SWITCH:
            read_switch(label, raw)
        claims: Claims = {}
        for modern_option, fixed_value in self.replacement:
            claims.update(MODERN_FLAGS[modern_option].read(label, raw if fixed_value is None else fixed_value, notes))
        return claims

    @property
    def help(self) -> str:
        """The ``--help`` line: what to use instead."""
        return f"deprecated alias of {self.replacement_text()}"

    @property
    def metavar(self) -> str | None:
        """The value placeholder of the (first) modern flag this alias stands for."""
        return MODERN_FLAGS[self.replacement[0][0]].metavar

    def replacement_text(self) -> str:
        """The modern command-line spelling, e.g. ``--prefill-cuda-graph-backend breakable``."""
        return " ".join(option if value is None else f"{option} {value}" for option, value in self.replacement)

    def replacement_keywords(self) -> str:
        """The modern keyword-argument spelling, e.g. ``prefill_cuda_graph_backend='breakable'``."""
        parts = []
        for option, value in self.replacement:
            if value is not None:
                parts.append(f"{option_dest(option)}={value!r}")
            elif MODERN_FLAGS[option].arity is Arity.SWITCH:
                parts.append(f"{option_dest(option)}=True")
            else:
                parts.append(option_dest(option))
        return ", ".join(parts)

    def deprecation_message(self) -> str:
        """The one warning this flag raises per ``resolve`` call."""
        return (
            f"{self.option} (keyword {self.dest}) is deprecated since cudagraph-config {self.deprecated_in} and will "
            f"be removed in {self.removed_in}; use {self.replacement_text()} "
            f"(keyword {self.replacement_keywords()}) instead"
        )


@dataclass(frozen=True)
class AliasFlag(_Spelling):
    """Another engine's spelling of one modern flag: same values, same precedence, no warning.

    It reads through the modern flag under its own name, so messages and ``CudaGraphConfig.sources`` name the
    spelling the user typed, and disagreeing with the modern flag is a same-precedence ``ConfigError``.
    """

    option: str
    canonical: str
    """The modern flag's option string."""
    engine: str
    """Whose spelling this is (``"SGLang"``, ``"vLLM"``), for the help text."""

    @property
    def arity(self) -> Arity:
        """The modern flag's arity."""
        return MODERN_FLAGS[self.canonical].arity

    @property
    def kind(self) -> OriginKind:
        """The modern flag's precedence kind."""
        return MODERN_FLAGS[self.canonical].kind

    @property
    def help(self) -> str:
        """The ``--help`` line."""
        return f"{self.engine}'s spelling of {self.canonical}"

    @property
    def metavar(self) -> str | None:
        """The modern flag's value placeholder."""
        return MODERN_FLAGS[self.canonical].metavar

    def read(self, label: str, raw: object, notes: Notes) -> Claims:
        """The modern flag's claims, read with this spelling's name in messages."""
        return MODERN_FLAGS[self.canonical].read(label, raw, notes)


def option_dest(option: str) -> str:
    """``--decode-cuda-graph-bs`` -> ``decode_cuda_graph_bs``."""
    return option.removeprefix("--").replace("-", "_")


_SHAPE_WORD = {Phase.DECODE: "batch sizes", Phase.PREFILL: "token counts"}


Reader = Callable[[str, object, Notes], Claims]


def _backend_reader(phase: Phase) -> Reader:
    return lambda label, raw, notes: {phase_key(phase, "backend"): read_backend(label, raw, phase, notes)}


def _disable_reader(phase: Phase) -> Reader:
    def read(label: str, raw: object, notes: Notes) -> Claims:
        read_switch(label, raw)
        return {phase_key(phase, "backend"): Backend.DISABLED}

    return read


def _value_reader(parse: Callable[[str, object], object], key: str) -> Reader:
    """A flag that sets one key: its value parsed by ``parse(label, raw)`` (which names the flag when it is bad)."""
    return lambda label, raw, notes: {key: parse(label, raw)}


def _phase_flags(phase: Phase) -> list[Flag]:
    shapes = _SHAPE_WORD[phase]
    choices = ",".join(backend.value for backend in allowed_backends(phase))
    return [
        Flag(
            BACKEND_OPTIONS[phase],
            Arity.ONE,
            OriginKind.FLAG,
            _backend_reader(phase),
            f"{phase} backend (default: {DEFAULT_CUDA_GRAPH_MODE[phase]})",
            f"{{{choices}}}",
        ),
        Flag(
            DISABLE_OPTIONS[phase],
            Arity.SWITCH,
            OriginKind.FLAG,
            _disable_reader(phase),
            f"run {phase} eagerly (same as {BACKEND_OPTIONS[phase]} disabled)",
        ),
        Flag(
            BUCKETS_OPTIONS[phase],
            Arity.MANY,
            OriginKind.FLAG,
            _value_reader(read_sizes, phase_key(phase, "buckets")),
            f"{phase} {shapes} to capture, separated by spaces or commas (default: a schedule up to the max)",
            "N",
        ),
        Flag(
            MAX_SIZE_OPTIONS[phase],
            Arity.ONE,
            OriginKind.FLAG,
            _value_reader(read_positive_int, phase_key(phase, "max_size")),
            f"largest {phase} {shapes[:-1]} to capture "
            + f"(default: {'from GPU memory, else ' if phase is Phase.DECODE else ''}{DEFAULT_MAX_SIZE[phase]})",
            "N",
        ),
        Flag(
            PADDING_RATIO_OPTIONS[phase],
            Arity.ONE,
            OriginKind.FLAG,
            _value_reader(read_padding_ratio, phase_key(phase, "max_padding_ratio")),
            f"a {phase} batch whose bucket is more than RATIO times its {shapes[:-1]} runs eagerly; RATIO >= 1 "
            "(default: none, any padding replays)",
            "RATIO",
        ),
        Flag(
            MEMORY_BUDGET_OPTIONS[phase],
            Arity.ONE,
            OriginKind.FLAG,
            _value_reader(read_memory_budget, phase_key(phase, "memory_budget")),
            # argparse formats help with %, so the percent sign of the examples is doubled.
            f"the most device memory the {phase} graphs may take: {BUDGET_EXAMPLES.replace('%', '%%')}; capture "
            "stops before exceeding it (default: no cap)",
            "SIZE",
        ),
        Flag(
            CAPTURE_POLICY_OPTIONS[phase],
            Arity.ONE,
            OriginKind.FLAG,
            _value_reader(read_capture_policy, phase_key(phase, "capture_policy")),
            f"when the {phase} graphs are captured: eager, every bucket at start-up; lazy, each bucket by the first "
            f"step routed to it, which replays it (default: {DEFAULT_CAPTURE_POLICY})",
            "{" + ",".join(policy.value for policy in CapturePolicy) + "}",
        ),
    ]


_MODERN_ROWS: tuple[Flag, ...] = (
    Flag(
        MODE_OPTION,
        Arity.ONE,
        OriginKind.JSON,
        read_mode,
        f"per-phase backends as a JSON object, e.g. {MODE_EXAMPLE}; a phase may map to an object of its settings "
        f"instead, e.g. {PHASE_OBJECT_EXAMPLE}; outranks every flag of a lower level, and locks the phases whose "
        "backend it gives against compatibility rules",
        "JSON",
    ),
    *_phase_flags(Phase.DECODE),
    *_phase_flags(Phase.PREFILL),
    Flag(
        COMPILER_OPTION,
        Arity.ONE,
        OriginKind.FLAG,
        lambda label, raw, notes: {"tc_piecewise_compiler": read_compiler(label, raw)},
        f"compiler of the tc_piecewise pieces (default: {TC_PIECEWISE_COMPILERS[0]})",
        "{" + ",".join(TC_PIECEWISE_COMPILERS) + "}",
    ),
    Flag(
        TORCH_COMPILE_OPTION,
        Arity.ONE,
        OriginKind.FLAG,
        _value_reader(read_positive_int, "torch_compile_max_bs"),
        "full decode graphs of batch sizes up to N capture an inductor-compiled forward (default: off; SGLang also "
        f"needs {ENABLE_TORCH_COMPILE_OPTION}, here either flag turns it on)",
        "N",
    ),
    Flag(
        TORCH_COMPILE_MODE_OPTION,
        Arity.ONE,
        OriginKind.FLAG,
        lambda label, raw, notes: {"torch_compile_mode": read_torch_compile_mode(label, raw)},
        f"torch.compile mode of the inductor-compiled forward ({TORCH_COMPILE_OPTION} buckets of full decode graphs, "
        f"and the pieces of tc_piecewise with {COMPILER_OPTION} inductor); modes that capture CUDA graphs of their "
        "own are refused (default: inductor's defaults)",
        "{" + ",".join(TORCH_COMPILE_MODES) + "}",
    ),
    Flag(
        COMPILE_CACHE_DIR_OPTION,
        Arity.ONE,
        OriginKind.FLAG,
        lambda label, raw, notes: {"compile_cache_dir": read_directory(label, raw)},
        "directory of inductor's FX-graph and autotune caches, for tc_piecewise's inductor pieces and the "
        f"{TORCH_COMPILE_OPTION} buckets; kept as written, nothing is created or checked here (default: inductor's "
        "own)",
        "DIR",
    ),
    Flag(
        SWITCH_OPTIONS["debug"],
        Arity.SWITCH,
        OriginKind.FLAG,
        _value_reader(read_switch, "debug"),
        "debug mode: extra checks and detail in capture and replay errors",
    ),
    Flag(
        SWITCH_OPTIONS["enable_gc"],
        Arity.SWITCH,
        OriginKind.FLAG,
        _value_reader(read_switch, "enable_gc"),
        "keep the garbage collector running during capture (slower capture)",
    ),
    Flag(
        SWITCH_OPTIONS["disable_padding"],
        Arity.SWITCH,
        OriginKind.FLAG,
        _value_reader(read_switch, "disable_padding"),
        "replay only batches that exactly match a captured shape",
    ),
    Flag(
        SWITCH_OPTIONS["profile_capture"],
        Arity.SWITCH,
        OriginKind.FLAG,
        _value_reader(read_switch, "profile_capture"),
        "record a torch.profiler trace of one capture; the runner logs the trace's path",
    ),
)

MODERN_FLAGS: Mapping[str, Flag] = MappingProxyType({flag.option: flag for flag in _MODERN_ROWS})
"""Modern flags by option string, in help order."""


def legacy_flags_from_table(table: RenameTable) -> tuple[LegacyFlag, ...]:
    """The legacy flags the ``cli_flag`` rows of ``table`` state, in table order.

    A row's ``new`` and ``also`` are the modern flags it stands for; its ``value``, when present, is what each of them
    takes, and makes the legacy flag a switch (a boolean switch that became a valued option). Without a value the
    legacy flag passes its own value through, so it takes as many values as its modern flags do. Every flag's keyword
    must have the matching ``kwarg`` row (same targets, same value), and every ``kwarg`` row a flag: the two spellings
    of one legacy switch cannot drift apart. Raises ``RenameTableError`` naming the row otherwise.
    """
    keyword_rows = dict(table.by_old(RenameKind.KWARG))
    flags = []
    for row in table.of_kind(RenameKind.CLI_FLAG):
        flag = _legacy_flag(table, row)
        _check_keyword_row(table, row, keyword_rows.pop(flag.dest, None))
        flags.append(flag)
    if keyword_rows:
        raise RenameTableError(
            f"{table.source}: kwarg row(s) {sorted(keyword_rows)} have no cli_flag row; a legacy keyword is the dest "
            "of a legacy flag, so add the flag's row"
        )
    return tuple(flags)


def _legacy_flag(table: RenameTable, row: Rename) -> LegacyFlag:
    where = f"{table.source}: cli_flag {row.old!r}"
    unknown = [target for target in row.targets if target not in MODERN_FLAGS]
    if unknown:
        raise RenameTableError(
            f"{where} names {unknown}, which are not modern flags; allowed: {', '.join(MODERN_FLAGS)}"
        )
    target_arities = {MODERN_FLAGS[target].arity for target in row.targets}
    if row.value is not None:
        arity = Arity.SWITCH
    elif len(target_arities) == 1:
        (arity,) = target_arities
    else:
        raise RenameTableError(f"{where} passes its value to flags taking different numbers of values: {row.targets}")
    return LegacyFlag(
        option=row.old,
        arity=arity,
        replacement=tuple((target, row.value) for target in row.targets),
        deprecated_in=row.deprecated_in,
        removed_in=row.removed_in,
    )


def _check_keyword_row(table: RenameTable, flag_row: Rename, keyword_row: Rename | None) -> None:
    dest = option_dest(flag_row.old)
    if keyword_row is None:
        raise RenameTableError(f"{table.source}: cli_flag {flag_row.old!r} has no kwarg row {dest!r}; add one")
    expected = (tuple(option_dest(target) for target in flag_row.targets), flag_row.value)
    found = (keyword_row.targets, keyword_row.value)
    if found != expected or (keyword_row.deprecated_in, keyword_row.removed_in) != (
        flag_row.deprecated_in,
        flag_row.removed_in,
    ):
        raise RenameTableError(
            f"{table.source}: kwarg {dest!r} (targets {found[0]}, value {found[1]!r}, {keyword_row.deprecated_in} -> "
            f"{keyword_row.removed_in}) disagrees with cli_flag {flag_row.old!r} (targets {expected[0]}, value "
            f"{expected[1]!r}, {flag_row.deprecated_in} -> {flag_row.removed_in}); one legacy switch, one meaning"
        )


LEGACY_FLAGS: tuple[LegacyFlag, ...] = legacy_flags_from_table(load_renames())
"""Deprecated aliases, one per ``cli_flag`` row of ``refactor/renames.toml``; each warns once per ``resolve`` call."""

ALIAS_FLAGS: tuple[AliasFlag, ...] = (
    AliasFlag("--cuda-graph-config", MODE_OPTION, "SGLang"),
    AliasFlag("--cuda-graph-backend-decode", BACKEND_OPTIONS[Phase.DECODE], "SGLang"),
    AliasFlag("--cuda-graph-backend-prefill", BACKEND_OPTIONS[Phase.PREFILL], "SGLang"),
    AliasFlag("--disable-decode-cuda-graph", DISABLE_OPTIONS[Phase.DECODE], "SGLang"),
    AliasFlag("--disable-prefill-cuda-graph", DISABLE_OPTIONS[Phase.PREFILL], "SGLang"),
    AliasFlag("--cuda-graph-bs-decode", BUCKETS_OPTIONS[Phase.DECODE], "SGLang"),
    AliasFlag("--cuda-graph-bs-prefill", BUCKETS_OPTIONS[Phase.PREFILL], "SGLang"),
    AliasFlag("--cuda-graph-max-bs-decode", MAX_SIZE_OPTIONS[Phase.DECODE], "SGLang"),
    AliasFlag("--cuda-graph-max-bs-prefill", MAX_SIZE_OPTIONS[Phase.PREFILL], "SGLang"),
    AliasFlag("--cuda-graph-tc-compiler", COMPILER_OPTION, "SGLang"),
    AliasFlag("--cudagraph-capture-sizes", BUCKETS_OPTIONS[Phase.DECODE], "vLLM"),
    AliasFlag("--max-cudagraph-capture-size", MAX_SIZE_OPTIONS[Phase.DECODE], "vLLM"),
)
"""Other engines' spellings of the modern flags, each resolving exactly like its modern flag (no warning)."""

SGLANG_FLAGS: tuple[Flag, ...] = (
    Flag(
        ENABLE_TORCH_COMPILE_OPTION,
        Arity.SWITCH,
        OriginKind.FLAG,
        _value_reader(read_switch, "enable_torch_compile"),
        f"SGLang's switch: compile small full decode graphs, up to {TORCH_COMPILE_OPTION} "
        f"(default {DEFAULT_TORCH_COMPILE_MAX_BS})",
    ),
)
"""SGLang's flags with no single modern equivalent, at the level of the per-phase flags."""

VLLM_MODE_OPTION = "--cudagraph-mode"


def _vllm_mode_help() -> str:
    meanings = "; ".join(
        f"{name}: decode {mode[Phase.DECODE]}, prefill {mode[Phase.PREFILL]}"
        for name, mode in VLLM_CUDAGRAPH_MODES.items()
    )
    return f"vLLM's mode name, any case ({meanings}); same level as the per-phase flags"


VLLM_FLAGS: tuple[Flag, ...] = (
    Flag(VLLM_MODE_OPTION, Arity.ONE, OriginKind.FLAG, read_vllm_mode, _vllm_mode_help(), "MODE"),
    Flag(
        "--enforce-eager",
        Arity.SWITCH,
        OriginKind.FLAG,
        read_enforce_eager,
        "vLLM's switch: run both phases eagerly (same as --cudagraph-mode NONE)",
    ),
    Flag(
        "--compilation-config",
        Arity.ONE,
        OriginKind.FLAG,
        read_compilation_config,
        "vLLM's compilation config as JSON; its cudagraph_mode, cudagraph_capture_sizes (decode batch sizes) and "
        "max_cudagraph_capture_size (largest decode batch) are read, vLLM's other fields are left to vLLM, and "
        "an unknown key is ignored with a warning naming the closest known one",
        "JSON",
    ),
)
"""vLLM's flags with no single modern equivalent, at the level of the per-phase flags."""


def _with_aliases(rows: tuple[Flag, ...]) -> tuple[Flag | AliasFlag, ...]:
    # Each alias right after its modern flag: both read in one place of the order, so which of several bad flags is
    # reported first does not depend on the spelling.
    aliases: dict[str, list[Flag | AliasFlag]] = {}
    for alias in ALIAS_FLAGS:
        aliases.setdefault(alias.canonical, []).append(alias)
    return tuple(row for flag in rows for row in [flag, *aliases.get(flag.option, [])])


AnyFlag = Flag | AliasFlag | LegacyFlag

ALL_FLAGS: tuple[AnyFlag, ...] = (*_with_aliases(_MODERN_ROWS), *SGLANG_FLAGS, *VLLM_FLAGS, *LEGACY_FLAGS)
FLAGS_BY_DEST: Mapping[str, AnyFlag] = MappingProxyType({flag.dest: flag for flag in ALL_FLAGS})
"""Every flag by its ``dest``: the names ``resolve`` accepts as keyword arguments."""

GROUP_TITLE = "CUDA graphs"


def _removal_versions() -> str:
    return " or ".join(sorted({flag.removed_in for flag in LEGACY_FLAGS}))


def add_cli_args(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """Register every CUDA-graph flag (modern, aliases, legacy) in one argument group of ``parser``; return the group.

    Values are stored raw (strings) and every unset flag is ``None``, so ``resolve(parser.parse_args())`` can tell
    what the user gave and reports bad values with one ``ConfigError`` line rather than argparse's usage text.

    Example:
        >>> import argparse
        >>> from cudagraph.config import add_cli_args, resolve
        >>> parser = argparse.ArgumentParser()
        >>> _ = add_cli_args(parser)
        >>> resolve(parser.parse_args(["--decode-cuda-graph-max-bs", "16"])).decode.buckets
        (1, 2, 4, 8, 16)
    """
    group = parser.add_argument_group(
        GROUP_TITLE,
        f"Precedence: {MODE_OPTION} (or SGLang's --cuda-graph-config) > per-phase flags, SGLang's and vLLM's "
        f"spellings of them, and vLLM's {VLLM_MODE_OPTION}, --enforce-eager, --compilation-config > deprecated flags > "
        "defaults. Two flags of one level that disagree are an error. "
        f"Deprecated flags warn (FutureWarning) and are removed in cudagraph-config {_removal_versions()}.",
    )
    for flag in ALL_FLAGS:
        if flag.arity is Arity.SWITCH:
            group.add_argument(flag.option, action="store_true", default=None, help=flag.help)
        else:
            group.add_argument(
                flag.option,
                nargs="+" if flag.arity is Arity.MANY else None,
                default=None,
                metavar=flag.metavar,
                help=flag.help,
            )
    return group
