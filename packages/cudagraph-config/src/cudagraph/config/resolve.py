"""``resolve``: every way a user can state the CUDA-graph mode -> one frozen ``CudaGraphConfig``.

Pipeline: parse (flags or keywords -> claims) -> settle precedence (JSON > per-phase flags > legacy flags) ->
defaults -> compatibility rules -> buckets (the max always the last one), padding ratios, memory budgets and
validation. Warnings are collected while resolving and raised at the
end, once per legacy flag and once per overridden setting, so a failed resolution warns about nothing. Log lines
(a rule that turned phases off: one line per rule; settings left unused by a phase that is off: one line per phase)
are collected the same way and logged under ``cudagraph.config`` at the end.
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import cast

from .bucket_schedules import default_buckets, default_max_size
from .environment import Environment
from .flags import ALL_FLAGS, FLAGS_BY_DEST, AnyFlag, Arity, LegacyFlag
from .grid import MAX_APPENDED_NOTE
from .legacy_values import legacy_value_message
from .memory_budget import MemoryBudget
from .origins import PRECEDENCE, Origin, OriginKind
from .phase_config import PHASE_FIELDS
from .rules import CompatibilityRule, RuleContext, first_applicable_rule
from .types import ENGINE_WIDE_FIELDS, CudaGraphConfig, PhaseConfig
from .values import Notes
from .vocabulary import (
    COMPILER_OPTION,
    DEFAULT_CAPTURE_POLICY,
    DEFAULT_CUDA_GRAPH_MODE,
    DEFAULT_TORCH_COMPILE_MAX_BS,
    ENABLE_TORCH_COMPILE_OPTION,
    SWITCH_OPTIONS,
    TC_PIECEWISE_COMPILERS,
    TORCH_COMPILE_OPTION,
    Backend,
    CapturePolicy,
    ConfigError,
    LegacyFlagWarning,
    OverriddenSettingWarning,
    Phase,
    phase_key,
)

logger = logging.getLogger("cudagraph.config")

_DEFAULT = Origin(OriginKind.DEFAULT)


@dataclass(frozen=True)
class Claim:
    """One setting as stated by one flag: ``key`` (``"decode.backend"``...), the typed value, and its origin."""

    key: str
    value: object
    origin: Origin


@dataclass(frozen=True)
class _FiredRule:
    """A compatibility rule that turned ``phase`` off, and what the phase was before (for its log line)."""

    rule: CompatibilityRule
    phase: Phase
    was: Backend
    origin: Origin

    @property
    def level(self) -> int:
        # Overruling something the user asked for deserves a warning; adjusting a default is routine.
        return logging.WARNING if self.origin.user_given else logging.INFO

    def before(self) -> str:
        """``was full from default``."""
        return f"was {self.was} from {self.origin}"


@dataclass
class _Resolution:
    """The state one ``resolve`` call builds up: settled claims, the sources of values, and what to log at the end."""

    settled: dict[str, Claim]
    sources: dict[str, str]
    fired: list[_FiredRule] = field(default_factory=list)
    logs: list[tuple[int, str]] = field(default_factory=list)
    """Log lines other than the rules' (level, message)."""

    def value(self, key: str, default: object) -> object:
        claim = self.settled.get(key)
        self.sources[key] = str(claim.origin if claim else _DEFAULT)
        return claim.value if claim else default


def _show(value: object) -> str:
    if isinstance(value, tuple):
        return "[" + ", ".join(str(item) for item in value) + "]"
    if isinstance(value, str):  # Backend is a str enum
        return repr(str(value))
    return str(value)


def _is_given(flag: AnyFlag, raw: object) -> bool:
    # argparse leaves unset flags None; a Python caller's switch=False means "not asked for" as well.
    return raw is not None and not (flag.arity is Arity.SWITCH and raw is False)


def _raw_values(namespace: object, keywords: Mapping[str, object]) -> dict[str, object]:
    provided: dict[str, object] = {}
    if isinstance(namespace, Mapping):
        keywords = {**namespace, **keywords}
    elif namespace is not None:
        # An engine's namespace holds its own options too: read only ours.
        provided = {dest: getattr(namespace, dest) for dest in FLAGS_BY_DEST if hasattr(namespace, dest)}
    unknown = sorted(set(keywords) - set(FLAGS_BY_DEST))
    if unknown:
        raise ConfigError(
            f"unknown CUDA-graph setting {unknown[0]!r}; allowed keyword arguments: {', '.join(FLAGS_BY_DEST)}"
        )
    provided.update(keywords)
    return provided


def _claims(provided: Mapping[str, object], notices: list[tuple[type[Warning], str]]) -> list[Claim]:
    claims: list[Claim] = []
    legacy_values: dict[str, list[str]] = {}  # spelling -> the flags that used it, for one warning per spelling
    for flag in ALL_FLAGS:
        raw = provided.get(flag.dest)
        if not _is_given(flag, raw):
            continue
        notes: Notes = []
        read = flag.read(flag.option, raw, notes)
        spelled = {note.key: f"legacy value {note.spelling!r}" for note in notes}
        claims += [
            Claim(key, value, Origin(flag.kind, flag.option, spelled.get(key, ""))) for key, value in read.items()
        ]
        for note in notes:
            labels = legacy_values.setdefault(note.spelling, [])
            labels += [] if note.label in labels else [note.label]
        if isinstance(flag, LegacyFlag):
            notices.append((LegacyFlagWarning, flag.deprecation_message()))
    notices += [
        (LegacyFlagWarning, legacy_value_message(spelling, labels)) for spelling, labels in legacy_values.items()
    ]
    return claims


def _settle(claims: list[Claim], notices: list[tuple[type[Warning], str]]) -> dict[str, Claim]:
    """Per key, the claim of the highest-precedence source; equal-rank disagreement is an error."""
    by_key: dict[str, list[Claim]] = {}
    for claim in claims:
        by_key.setdefault(claim.key, []).append(claim)
    settled: dict[str, Claim] = {}
    for key, key_claims in by_key.items():
        top_rank = max(PRECEDENCE[claim.origin.kind] for claim in key_claims)
        top = [claim for claim in key_claims if PRECEDENCE[claim.origin.kind] == top_rank]
        winner = top[0]
        for rival in top[1:]:
            if rival.value != winner.value:
                raise ConfigError(
                    f"{key}: {winner.origin.detail} gives {_show(winner.value)} but {rival.origin.detail} gives "
                    f"{_show(rival.value)}; both have the same precedence, so give only one"
                )
        overridden = [
            claim for claim in key_claims if PRECEDENCE[claim.origin.kind] < top_rank and claim.value != winner.value
        ]
        if overridden:
            losers = " and ".join(f"{claim.origin.detail} {_show(claim.value)}" for claim in overridden)
            notices.append(
                (OverriddenSettingWarning, f"{key}: {winner.origin.detail} {_show(winner.value)} overrides {losers}")
            )
        settled[key] = winner
    return settled


def _phase_backend(phase: Phase, resolution: _Resolution, environment: Environment, debug: bool) -> Backend:
    """The phase's backend after defaults and compatibility rules (which skip phases locked by JSON)."""
    claim = resolution.settled.get(phase_key(phase, "backend"))
    backend = Backend(claim.value) if claim else DEFAULT_CUDA_GRAPH_MODE[phase]
    origin = claim.origin if claim else _DEFAULT
    rule = first_applicable_rule(RuleContext(environment, phase, backend, debug))
    if rule is not None and origin.kind is OriginKind.JSON:
        logger.warning(
            "rule %s would turn %s CUDA graphs off (%s), but %s sets %s explicitly; keeping %s",
            rule.name,
            phase,
            rule.why(environment),
            origin.detail,
            phase,
            backend,
        )
    elif rule is not None:
        resolution.fired.append(_FiredRule(rule, phase, backend, origin))
        backend, origin = Backend.DISABLED, Origin(OriginKind.RULE, rule.explain(environment))
    resolution.sources[phase_key(phase, "backend")] = str(origin)
    return backend


def _rule_lines(fired: list[_FiredRule], environment: Environment) -> list[tuple[int, str]]:
    """One log line per rule and level: a rule that turns both phases off (no CUDA device) says so once."""
    groups: dict[tuple[str, int], list[_FiredRule]] = {}
    for entry in fired:
        groups.setdefault((entry.rule.name, entry.level), []).append(entry)
    lines = []
    for (_, level), entries in groups.items():
        phases = " and ".join(str(entry.phase) for entry in entries)
        if len(entries) == 1:
            before = entries[0].before()
        else:
            before = ", ".join(f"{entry.phase} {entry.before()}" for entry in entries)
        lines.append((level, f"{phases} CUDA graphs off ({before}) by rule {entries[0].rule.explain(environment)}"))
    return lines


def _note_unused_settings(phase: Phase, resolution: _Resolution) -> None:
    """One line when settings the user gave for ``phase`` go unused because the phase is off: a warning when the user
    turned it off too (``--enforce-eager --cuda-graph-max-bs 64``), info when a compatibility rule did."""
    given = [
        claim
        for name in PHASE_FIELDS
        if name != "backend" and (claim := resolution.settled.get(phase_key(phase, name))) is not None
    ]
    if not given:
        return
    backend_claim = resolution.settled.get(phase_key(phase, "backend"))
    off_by_user = backend_claim is not None and Backend(backend_claim.value) is Backend.DISABLED
    settings = " and ".join(f"{claim.origin.detail} {_show(claim.value)}" for claim in given)
    verb = "is" if len(given) == 1 else "are"
    off = resolution.sources[phase_key(phase, "backend")]
    resolution.logs.append(
        (
            logging.WARNING if off_by_user else logging.INFO,
            f"{settings} {verb} unused: {phase} CUDA graphs are off ({off})",
        )
    )


def _phase_config(phase: Phase, backend: Backend, resolution: _Resolution, environment: Environment) -> PhaseConfig:
    """The phase's buckets, max size, padding ratio and memory budget; a disabled phase has none of them."""
    buckets, max_size = _phase_shapes(phase, backend, resolution, environment)
    ratio_key, budget_key = phase_key(phase, "max_padding_ratio"), phase_key(phase, "memory_budget")
    policy_key = phase_key(phase, "capture_policy")
    if backend is Backend.DISABLED:
        resolution.sources[ratio_key] = resolution.sources[budget_key] = _disabled_source(phase)
        resolution.sources[policy_key] = _disabled_source(phase)
        _note_unused_settings(phase, resolution)
        return PhaseConfig(backend, buckets, max_size)
    # The readers in ``values`` and ``memory_budget`` produced these types; the casts only tell the type checker.
    ratio = cast("float | None", resolution.value(ratio_key, None))
    budget = cast("MemoryBudget | None", resolution.value(budget_key, None))
    policy = cast(CapturePolicy, resolution.value(policy_key, DEFAULT_CAPTURE_POLICY))
    return PhaseConfig(backend, buckets, max_size, max_padding_ratio=ratio, memory_budget=budget, capture_policy=policy)


def _disabled_source(phase: Phase) -> str:
    return str(Origin(OriginKind.DERIVED, f"from {phase}.backend disabled"))


def _phase_shapes(
    phase: Phase, backend: Backend, resolution: _Resolution, environment: Environment
) -> tuple[tuple[int, ...], int]:
    """The phase's buckets and max size: explicit ones validated, with the max appended as the last bucket when it
    is above them (the largest size is always captured), else the default schedule up to the max."""
    buckets_key, max_key = phase_key(phase, "buckets"), phase_key(phase, "max_size")
    buckets_claim, max_claim = resolution.settled.get(buckets_key), resolution.settled.get(max_key)
    # The readers in ``values`` produced these types; the casts only tell the type checker.
    explicit_buckets = cast("tuple[int, ...] | None", buckets_claim.value if buckets_claim else None)
    explicit_max = cast("int | None", max_claim.value if max_claim else None)
    if buckets_claim and max_claim and explicit_buckets and explicit_max and explicit_buckets[-1] > explicit_max:
        # Checked even for a disabled phase: bad input stays bad whatever else the flags say.
        raise ConfigError(
            f"{buckets_claim.origin.detail}: {explicit_buckets[-1]} exceeds the maximum {explicit_max} given by "
            f"{max_claim.origin.detail}; allowed: positive integers up to {explicit_max}"
        )
    if backend is Backend.DISABLED:
        resolution.sources[buckets_key] = resolution.sources[max_key] = _disabled_source(phase)
        return (), 0
    if buckets_claim and explicit_buckets:
        resolution.sources[buckets_key] = str(buckets_claim.origin)
        if not (max_claim and explicit_max):
            resolution.sources[max_key] = str(Origin(OriginKind.DERIVED, f"from the largest of {phase}.buckets"))
            return explicit_buckets, explicit_buckets[-1]
        resolution.sources[max_key] = str(max_claim.origin)
        if explicit_max == explicit_buckets[-1]:
            return explicit_buckets, explicit_max
        note = f"max {explicit_max} from {max_claim.origin.detail} {MAX_APPENDED_NOTE}"
        notes = "; ".join(text for text in (buckets_claim.origin.note, note) if text)
        resolution.sources[buckets_key] = str(dataclasses.replace(buckets_claim.origin, note=notes))
        return (*explicit_buckets, explicit_max), explicit_max
    if max_claim and explicit_max:
        max_size = explicit_max
        resolution.sources[max_key] = str(max_claim.origin)
    else:
        max_size, why = default_max_size(phase, environment)
        resolution.sources[max_key] = str(Origin(OriginKind.DEFAULT, why))
    resolution.sources[buckets_key] = str(Origin(OriginKind.DEFAULT, f"schedule up to {phase}.max_size"))
    return default_buckets(phase, max_size), max_size


def _torch_compile_max_bs(resolution: _Resolution) -> int:
    """The largest decode batch whose full graph captures a compiled forward (0: none).

    ``--torch-compile-max-bs`` gives it; SGLang's ``--enable-torch-compile`` alone means SGLang's default. It only
    applies to full decode graphs: with another decode graph backend it is an error, with decode disabled it is kept
    and unused.
    """
    key = "torch_compile_max_bs"
    claim, enable = resolution.settled.get(key), resolution.settled.get("enable_torch_compile")
    if claim is not None:
        value, origin = cast(int, claim.value), claim.origin
    elif enable is not None:
        value = DEFAULT_TORCH_COMPILE_MAX_BS
        origin = Origin(OriginKind.DERIVED, f"from {ENABLE_TORCH_COMPILE_OPTION} (SGLang's default)")
    else:
        value, origin = 0, _DEFAULT
    resolution.sources[key] = str(origin)
    # Checked against the backend the user asked for, before compatibility rules: the environment never makes
    # input valid or invalid.
    backend_claim = resolution.settled.get(phase_key(Phase.DECODE, "backend"))
    requested = Backend(backend_claim.value) if backend_claim else DEFAULT_CUDA_GRAPH_MODE[Phase.DECODE]
    if value and requested not in (Backend.FULL, Backend.DISABLED):
        flag = claim.origin.detail if claim is not None else ENABLE_TORCH_COMPILE_OPTION
        where = f"from {backend_claim.origin.detail}" if backend_claim else "the default"
        raise ConfigError(
            f"{flag}: compiled small batches run inside full decode graphs, but decode uses {requested} ({where}); use "
            f"--decode-cuda-graph-backend full, or tc_piecewise with --tc-piecewise-compiler inductor to compile "
            "pieces between breaks"
        )
    return value


_UNUSED_COMPILE_SETTING = (
    f"unused: nothing compiles with inductor; it applies with {TORCH_COMPILE_OPTION} and full decode graphs, or "
    f"{COMPILER_OPTION} inductor and a tc_piecewise phase"
)


def _compile_setting(key: str, resolution: _Resolution, compiles: bool) -> str | None:
    """A setting of the inductor-compiled forwards: ``torch_compile_mode`` (``None``: inductor's defaults) or
    ``compile_cache_dir`` (``None``: inductor's own).

    A setting given while nothing compiles (after compatibility rules) is kept, and its source says it is unused.
    """
    claim = resolution.settled.get(key)
    if claim is None:
        resolution.sources[key] = str(_DEFAULT)
        return None
    origin = claim.origin if compiles else dataclasses.replace(claim.origin, note=_UNUSED_COMPILE_SETTING)
    resolution.sources[key] = str(origin)
    return cast(str, claim.value)


def resolve(
    namespace: object = None, /, *, environment: Environment | None = None, **kwargs: object
) -> CudaGraphConfig:
    """Resolve the CUDA-graph flags of ``namespace`` (from ``add_cli_args``) or ``kwargs`` into one config.

    Keyword arguments are the flags' ``dest`` names, other engines' and legacy ones included
    (``decode_cuda_graph_bs=[1, 2, 4]``, ``cuda_graph_backend_decode="full"``, ``cudagraph_mode="FULL_DECODE_ONLY"``,
    ``disable_cuda_graph=True``); given with a namespace, they replace its attributes of the same name. A plain
    mapping may stand in for the namespace. Both routes give equal configs, the same errors and the same warnings.

    Precedence, highest first: ``--cuda-graph-mode`` JSON (or SGLang's ``--cuda-graph-config``) > per-phase flags,
    with SGLang's and vLLM's spellings (``ALIAS_FLAGS``, ``VLLM_FLAGS``) at the same level > legacy flags > defaults.
    Two sources of one level that give one setting different values are a ``ConfigError`` naming both. When a higher
    source overrides a different value from a lower one, an ``OverriddenSettingWarning`` names both; each legacy
    flag, and each legacy backend value spelling (``"tcpcg"``, see ``LEGACY_BACKEND_VALUES``), raises one
    ``LegacyFlagWarning`` (a ``FutureWarning``) naming its replacement. Compatibility rules over
    ``environment`` (default: a plain CUDA engine, where none applies) may turn phases off, except the phases whose
    backend ``--cuda-graph-mode`` gives. A phase there may be an object of its settings (``backend``,
    ``max_padding_ratio``, ``memory_budget``), each at the JSON's level. Explicit buckets with a larger explicit max
    get the max appended: the largest size is always captured. Raises ``ConfigError`` for any bad input.

    Example:
        >>> from cudagraph.config import Environment, resolve
        >>> config = resolve(decode_cuda_graph_bs=[8, 1, 4, 4], environment=Environment(lora=True))
        >>> config.decode.buckets, config.backend("prefill").value, config.sources["prefill.backend"].split(":")[0]
        ((1, 4, 8), 'disabled', 'rule lora')
    """
    environment = Environment() if environment is None else environment
    if not isinstance(environment, Environment):
        raise ConfigError(f"environment: expected a cudagraph.config.Environment, got {environment!r}")
    notices: list[tuple[type[Warning], str]] = []
    claims = _claims(_raw_values(namespace, kwargs), notices)
    resolution = _Resolution(_settle(claims, notices), {})
    debug = bool(resolution.value("debug", False))
    backends = {phase: _phase_backend(phase, resolution, environment, debug) for phase in Phase}
    decode, prefill = (_phase_config(phase, backends[phase], resolution, environment) for phase in Phase)
    compiler = str(resolution.value("tc_piecewise_compiler", TC_PIECEWISE_COMPILERS[0]))
    switches = {switch: bool(resolution.value(switch, False)) for switch in SWITCH_OPTIONS}
    config = CudaGraphConfig(
        decode=decode,
        prefill=prefill,
        tc_piecewise_compiler=compiler,
        torch_compile_max_bs=_torch_compile_max_bs(resolution),
        # Set below, once the config says whether anything compiles with inductor.
        torch_compile_mode=None,
        compile_cache_dir=None,
        sources={},
        **switches,
    )
    # The compile settings are marked unused unless inductor compiles something: the config's own rule says whether.
    compiles = config.model_forward_compiler == "inductor"
    config = dataclasses.replace(
        config,
        torch_compile_mode=_compile_setting("torch_compile_mode", resolution, compiles),
        compile_cache_dir=_compile_setting("compile_cache_dir", resolution, compiles),
        sources=MappingProxyType(dict(sorted(resolution.sources.items(), key=lambda item: _key_order(item[0])))),
    )
    for level, line in [*_rule_lines(resolution.fired, environment), *resolution.logs]:
        logger.log(level, line)
    for category, message in notices:
        warnings.warn(message, category, stacklevel=2)
    return config


def _key_order(key: str) -> int:
    order = [phase_key(phase, name) for phase in Phase for name in PHASE_FIELDS]
    return [*order, *ENGINE_WIDE_FIELDS].index(key)
