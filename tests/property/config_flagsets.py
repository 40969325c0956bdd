"""Hypothesis strategies for CUDA-graph flag sets, and their two spellings: a command line and keyword arguments.

A flag set maps a flag's ``dest`` to its raw command-line form: ``True`` for a switch, one string token, or a list of
string tokens. ``argv`` and ``keywords`` render the same set for the two routes into ``resolve``. Every spelling of a
flag (modern, other engines' aliases, legacy) is drawn, so the properties hold for all of them.
"""

from __future__ import annotations

import argparse
import json
import re
import warnings
from collections.abc import Callable
from dataclasses import dataclass

from hypothesis import strategies as st

from cudagraph.config import (
    ALIAS_FLAGS,
    ALLOWED_BACKENDS_PER_PHASE,
    LEGACY_BACKEND_VALUES,
    LEGACY_FLAGS,
    MODERN_FLAGS,
    SGLANG_FLAGS,
    TORCH_COMPILE_MODES,
    VLLM_FLAGS,
    Backend,
    CapturePolicy,
    ConfigError,
    CudaGraphConfig,
    Environment,
    Phase,
    add_cli_args,
    resolve,
)
from cudagraph.config.flags import (
    CAPTURE_POLICY_OPTIONS,
    COMPILE_CACHE_DIR_OPTION,
    FLAGS_BY_DEST,
    MEMORY_BUDGET_OPTIONS,
    MODE_OPTION,
    PADDING_RATIO_OPTIONS,
    AliasFlag,
    Arity,
    LegacyFlag,
)
from cudagraph.config.mode_json import PHASE_JSON_KEYS
from cudagraph.config.vllm import allowed_vllm_modes

FlagSet = dict[str, object]

_PARSER = argparse.ArgumentParser(exit_on_error=False)
add_cli_args(_PARSER)

BACKEND_NAMES = [backend.value for backend in Backend]
LEGACY_BACKEND_SPELLINGS = sorted(LEGACY_BACKEND_VALUES)
JUNK_BACKENDS = ["FULL", "piecewise", "TCPCG", "tc-piecewise", ""]
JUNK_SIZES = ["0", "-1", "1.5", "x", "", "1,,2", ",", "3,", "2,x"]
JUNK_MODES = ["{", "[]", '"full"', "null", "1", '{"decode": "full", "decode": "full"}', '{"decode": {}}']


def dest(option: str) -> str:
    return option.removeprefix("--").replace("-", "_")


def canonical_option(option: str) -> str:
    """The modern flag that ``option`` spells or replaces (the first one, for a legacy flag that stands for two)."""
    flag = FLAGS_BY_DEST[dest(option)]
    if isinstance(flag, AliasFlag):
        return flag.canonical
    if isinstance(flag, LegacyFlag):
        return flag.replacement[0][0]
    return option


ALIASES_OF: dict[str, list[str]] = {}
for _alias in ALIAS_FLAGS:
    ALIASES_OF.setdefault(_alias.canonical, []).append(_alias.option)

JSON_DESTS = {dest(option) for option in [MODE_OPTION, *ALIASES_OF.get(MODE_OPTION, [])]}
"""The flags whose value is the per-phase JSON object (``--cuda-graph-mode`` and its spellings)."""
TEXT_DESTS = {*JSON_DESTS, "cudagraph_mode", "compilation_config", dest(COMPILE_CACHE_DIR_OPTION)}
"""Flags whose value a Python caller passes as the same text a command line holds (a directory named ``0`` is a
string in Python too)."""


def spellings(option: str) -> list[str]:
    """``option`` and the other engines' spellings of it, as ``dest`` names."""
    return [dest(option), *(dest(alias) for alias in ALIASES_OF.get(option, []))]


def argv(flags: FlagSet) -> list[str]:
    """The command line of ``flags``; single values use ``--flag=value`` so that no value can look like an option."""
    args: list[str] = []
    for name, raw in flags.items():
        flag = FLAGS_BY_DEST[name]
        if flag.arity is Arity.SWITCH:
            args.append(flag.option)
        elif flag.arity is Arity.MANY:
            assert isinstance(raw, list)
            args += [flag.option, *raw]
        else:
            args.append(f"{flag.option}={raw}")
    return args


def _python_value(token: str) -> object:
    # Python callers pass ints where a command line has digits; anything else stays the same string.
    return int(token) if re.fullmatch(r"-?[0-9]+", token) else token


def keywords(flags: FlagSet) -> dict[str, object]:
    """The keyword arguments a Python caller would pass for ``flags``."""
    result: dict[str, object] = {}
    for name, raw in flags.items():
        if name in TEXT_DESTS or raw is True:
            result[name] = raw
        elif isinstance(raw, list):
            result[name] = [_python_value(token) for token in raw]
        else:
            assert isinstance(raw, str)
            result[name] = _python_value(raw)
    return result


def parse(args: list[str]) -> argparse.Namespace:
    return _PARSER.parse_args(args)


Outcome = tuple[CudaGraphConfig | None, str | None, list[tuple[type[Warning], str]]]


def outcome(call: Callable[[], CudaGraphConfig]) -> Outcome:
    """``(config, None, warnings)`` or ``(None, error message, warnings)``; any other exception propagates."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            config: CudaGraphConfig | None = call()
            error = None
        except ConfigError as raised:
            config, error = None, str(raised)
    return config, error, [(warning.category, str(warning.message)) for warning in caught]


def via_cli(flags: FlagSet, environment: Environment | None = None) -> Outcome:
    return outcome(lambda: resolve(parse(argv(flags)), environment=environment))


def via_keywords(flags: FlagSet, environment: Environment | None = None) -> Outcome:
    return outcome(lambda: resolve(environment=environment, **keywords(flags)))


# --- value strategies ---------------------------------------------------------------------------------------------

valid_backend = st.sampled_from(BACKEND_NAMES)
any_backend = st.one_of(valid_backend, st.sampled_from(JUNK_BACKENDS), st.sampled_from(LEGACY_BACKEND_SPELLINGS))

valid_ratio_number = st.one_of(
    st.floats(1, 16, allow_nan=False, allow_infinity=False), st.integers(1, 4), st.sampled_from([1.0, 1.25, 1.5, 2.0])
)
valid_ratio = st.one_of(valid_ratio_number.map(str), st.sampled_from(["1", "1.5", "2.0", "1e0", " 1.25"]))
JUNK_RATIOS = ["0.5", "0", "-1", "x", "", "inf", "nan", "1,5", "1.5x", "0.999"]
any_ratio = st.one_of(valid_ratio, st.sampled_from(JUNK_RATIOS))
valid_budget = st.one_of(
    st.sampled_from(["1.5GiB", "512MiB", "2", "20%", "100%", "2GB", "0.5", "64kib", "1e3MiB", "12.5 %", "7B"]),
    st.integers(1, 2**36).map(lambda amount: f"{amount}B"),
    st.integers(1, 1000).map(lambda tenths: f"{tenths / 10:g}%"),
)
JUNK_BUDGETS = ["0", "-1", "101%", "0%", "x", "", "1/2", "2XB", "%", "GiB", "1e9999"]
any_budget = st.one_of(valid_budget, st.sampled_from(JUNK_BUDGETS))
valid_directory = st.sampled_from(["/tmp/inductor", "cache", "./a b", "-dashed", "~/x", "0", "C:\\cache"])
any_directory = st.one_of(valid_directory, st.just(""))
valid_capture_policy = st.sampled_from([policy.value for policy in CapturePolicy])
any_capture_policy = st.one_of(valid_capture_policy, st.sampled_from(["LAZY", "Eager", "on_demand", "", " lazy"]))

# A phase's JSON value: a backend name, or an object of its settings (JSON numbers or strings).
_JSON_RATIO = st.one_of(valid_ratio_number, valid_ratio)
valid_phase_object = st.fixed_dictionaries(
    {},
    optional={
        "backend": valid_backend,
        "max_padding_ratio": _JSON_RATIO,
        "memory_budget": valid_budget,
        "capture_policy": valid_capture_policy,
    },
)
any_phase_object = st.fixed_dictionaries(
    {},
    optional={
        "backend": any_backend,
        "max_padding_ratio": st.one_of(_JSON_RATIO, st.sampled_from([*JUNK_RATIOS, 0.5, None, True])),
        "memory_budget": st.one_of(any_budget, st.sampled_from([0, -1, 1.5, None, [1]])),
        "capture_policy": st.one_of(any_capture_policy, st.sampled_from([None, 1, True])),
        "max_padding": valid_ratio_number,  # an unknown key
        "buckets": st.just([1, 2]),
    },
)
PHASE_NAMES = [phase.value for phase in Phase]
valid_mode = st.dictionaries(
    st.sampled_from(PHASE_NAMES), st.one_of(valid_backend, valid_backend, valid_phase_object)
).map(json.dumps)
any_mode = st.one_of(
    valid_mode,
    st.dictionaries(st.sampled_from(["decode", "prefill", "dcode"]), st.one_of(any_backend, any_phase_object)).map(
        json.dumps
    ),
    st.sampled_from(JUNK_MODES),
)
valid_size = st.integers(1, 64).map(str)
valid_max = st.integers(1, 1000).map(str)
any_size = st.one_of(*([st.integers(-2, 700).map(str)] * 4), st.sampled_from(JUNK_SIZES))
valid_sizes = st.lists(  # tokens of one size or several joined by commas ("1,2,4")
    st.lists(valid_size, min_size=1, max_size=3).map(",".join), min_size=1, max_size=4
)
any_sizes = st.lists(any_size, min_size=1, max_size=6)
valid_compiler = st.sampled_from(["eager", "inductor"])
any_compiler = st.sampled_from(["eager", "inductor", "aot", ""])
valid_compile_mode = st.sampled_from(TORCH_COMPILE_MODES)
any_compile_mode = st.sampled_from([*TORCH_COMPILE_MODES, "reduce-overhead", "max-autotune", "max_autotune", ""])

VLLM_MODE_NAMES = list(allowed_vllm_modes())
valid_vllm_mode = st.tuples(st.sampled_from(VLLM_MODE_NAMES), st.sampled_from([str.upper, str.lower, str.title])).map(
    lambda pair: pair[1](pair[0])
)
any_vllm_mode = st.one_of(valid_vllm_mode, st.sampled_from(["FULL", "EAGER", "", "piecewise ", '{"decode": "full"}']))
_VLLM_OTHER_KEYS = {"level": st.integers(0, 3), "pass_config": st.just({"enable_fusion": True})}
valid_compilation_config = st.fixed_dictionaries(
    {},
    optional={
        "cudagraph_mode": st.one_of(st.none(), valid_vllm_mode),
        "cudagraph_capture_sizes": st.one_of(st.none(), st.lists(st.integers(1, 64), min_size=1, max_size=6)),
        "max_cudagraph_capture_size": st.one_of(st.none(), st.integers(64, 1000)),
        **_VLLM_OTHER_KEYS,
    },
).map(json.dumps)
any_compilation_config = st.one_of(
    valid_compilation_config,
    st.fixed_dictionaries(
        {},
        optional={
            "cudagraph_mode": st.one_of(any_vllm_mode, st.integers(0, 2)),
            "cudagraph_capture_sizes": st.one_of(
                st.lists(st.integers(-2, 100), max_size=4), st.just("1,2"), st.lists(st.booleans(), max_size=2)
            ),
            "max_cudagraph_capture_size": st.one_of(st.integers(-1, 100), st.just("8"), st.just(2.5)),
            **_VLLM_OTHER_KEYS,
        },
    ).map(json.dumps),
    st.sampled_from(["[]", "{", "null", "3", '{"level": 1, "level": 2}']),
)


@dataclass(frozen=True)
class ValueKind:
    """The values one kind of flag takes: valid ones, any (malformed mixed in), and one valid value that claims every
    setting a flag of this kind can claim (to tell which flags can meet on a setting)."""

    valid: st.SearchStrategy[object]
    any: st.SearchStrategy[object]
    sample: object


VALUE_KINDS: dict[object, ValueKind] = {
    # arity or canonical option or value kind -> its values
    Arity.SWITCH: ValueKind(st.just(True), st.just(True), True),
    MODE_OPTION: ValueKind(
        valid_mode,
        any_mode,
        json.dumps(
            {
                phase: {
                    "backend": "disabled",
                    "max_padding_ratio": 2,
                    "memory_budget": "1GiB",
                    "capture_policy": "lazy",
                }
                for phase in PHASE_NAMES
            }
        ),
    ),
    "--cudagraph-mode": ValueKind(valid_vllm_mode, any_vllm_mode, "NONE"),
    "--compilation-config": ValueKind(
        valid_compilation_config,
        any_compilation_config,
        '{"cudagraph_mode": "NONE", "cudagraph_capture_sizes": [1], "max_cudagraph_capture_size": 1}',
    ),
    "backend": ValueKind(valid_backend, any_backend, "disabled"),
    "sizes": ValueKind(valid_sizes, any_sizes, ["1"]),
    "max": ValueKind(valid_max, any_size, "1"),
    "compiler": ValueKind(valid_compiler, any_compiler, "eager"),
    "--torch-compile-mode": ValueKind(valid_compile_mode, any_compile_mode, "default"),
    "ratio": ValueKind(valid_ratio, any_ratio, "2"),
    "budget": ValueKind(valid_budget, any_budget, "1GiB"),
    "capture_policy": ValueKind(valid_capture_policy, any_capture_policy, "lazy"),
    COMPILE_CACHE_DIR_OPTION: ValueKind(valid_directory, any_directory, "/tmp/inductor"),
}


def _value_kind(option: str) -> ValueKind:
    flag = FLAGS_BY_DEST[dest(option)]
    if flag.arity is Arity.SWITCH:
        return VALUE_KINDS[Arity.SWITCH]
    target = canonical_option(option)
    if target in VALUE_KINDS:
        return VALUE_KINDS[target]
    if target.endswith("-backend"):
        return VALUE_KINDS["backend"]
    if target in PADDING_RATIO_OPTIONS.values():
        return VALUE_KINDS["ratio"]
    if target in MEMORY_BUDGET_OPTIONS.values():
        return VALUE_KINDS["budget"]
    if target in CAPTURE_POLICY_OPTIONS.values():
        return VALUE_KINDS["capture_policy"]
    if target.endswith("compiler"):
        return VALUE_KINDS["compiler"]
    return VALUE_KINDS["sizes" if FLAGS_BY_DEST[dest(target)].arity is Arity.MANY else "max"]


def sample_value(option: str) -> object:
    """A valid value of ``option`` that claims every setting the flag can claim."""
    return _value_kind(option).sample


def value_strategy(option: str, *, valid: bool) -> st.SearchStrategy[object]:
    """Values of one flag: valid only, or with malformed ones mixed in."""
    kind = _value_kind(option)
    return kind.valid if valid else kind.any


ALL_OPTIONS = [
    *MODERN_FLAGS,
    *(flag.option for flag in (*ALIAS_FLAGS, *SGLANG_FLAGS, *VLLM_FLAGS, *LEGACY_FLAGS)),
]


def any_flag_sets() -> st.SearchStrategy[FlagSet]:
    """Any mix of flags (JSON, per-phase, aliases, vLLM's, legacy) with values that may be malformed or contradict."""
    return st.fixed_dictionaries({}, optional={dest(o): value_strategy(o, valid=False) for o in ALL_OPTIONS})


LEGACY_BACKEND_SWITCHES = [
    "disable_cuda_graph",
    "disable_piecewise_cuda_graph",
    "enable_breakable_cuda_graph",
    "enforce_piecewise_cuda_graph",
]


@st.composite
def valid_flag_sets(draw: st.DrawFn) -> FlagSet:
    """Flag sets of valid values that mostly resolve: at most one backend flag per phase and precedence level, so
    JSON, per-phase and legacy flags meet and override each other without same-level contradictions. Each modern
    flag is drawn in any of its spellings (``--decode-cuda-graph-backend`` or SGLang's
    ``--cuda-graph-backend-decode``)."""

    def spelled(option: str) -> str:
        return draw(st.sampled_from(spellings(option)))

    flags: FlagSet = {}
    if draw(st.booleans()):
        flags[spelled(MODE_OPTION)] = draw(valid_mode)
    # Both phases' backends from one vLLM spelling, or each phase from its own flags (not both: same level).
    vllm = draw(st.sampled_from([None, None, None, "cudagraph_mode", "enforce_eager", "compilation_config"]))
    if vllm == "cudagraph_mode":
        flags[vllm] = draw(valid_vllm_mode)
    elif vllm == "enforce_eager":
        flags[vllm] = True
    elif vllm == "compilation_config":
        mode = draw(st.fixed_dictionaries({"cudagraph_mode": valid_vllm_mode}, optional=_VLLM_OTHER_KEYS))
        flags[vllm] = json.dumps(mode)
    for phase in Phase:
        choice = "none" if vllm else draw(st.sampled_from(["none", "backend", "disable"]))
        if choice == "backend":
            allowed = [b.value for b in Backend if b in ALLOWED_BACKENDS_PER_PHASE[phase]]
            flags[spelled(f"--{phase.value}-cuda-graph-backend")] = draw(st.sampled_from(allowed))
        elif choice == "disable":
            flags[spelled(f"--{phase.value}-disable-cuda-graph")] = True
    legacy_switch = draw(st.sampled_from([None, *LEGACY_BACKEND_SWITCHES]))
    if legacy_switch:
        flags[legacy_switch] = True
    sized = [
        ("--decode-cuda-graph-bs", "cuda_graph_bs", valid_sizes),
        ("--decode-cuda-graph-max-bs", "cuda_graph_max_bs", valid_max),
        ("--prefill-cuda-graph-tokens", "piecewise_cuda_graph_tokens", valid_sizes),
        ("--prefill-cuda-graph-max-tokens", "piecewise_cuda_graph_max_tokens", valid_max),
        ("--tc-piecewise-compiler", "piecewise_cuda_graph_compiler", valid_compiler),
    ]
    for modern, legacy, values in sized:
        for name in draw(st.sampled_from([(), (modern,), (legacy,), (modern, legacy)])):
            flags[spelled(name) if name.startswith("--") else name] = draw(values)
    # Compiled small buckets: rarely, as they are an error unless decode is full (or disabled).
    if draw(st.integers(0, 3)) == 0:
        for name in draw(
            st.sampled_from(
                [("torch_compile_max_bs",), ("enable_torch_compile",), ("torch_compile_max_bs", "enable_torch_compile")]
            )
        ):
            flags[name] = True if name == "enable_torch_compile" else draw(valid_max)
    # A compile mode and a cache directory are valid whatever else is given (unused when nothing compiles).
    if draw(st.integers(0, 2)) == 0:
        flags["torch_compile_mode"] = draw(valid_compile_mode)
    if draw(st.integers(0, 2)) == 0:
        flags[dest(COMPILE_CACHE_DIR_OPTION)] = draw(valid_directory)
    for phase in Phase:
        if draw(st.integers(0, 2)) == 0:
            flags[dest(PADDING_RATIO_OPTIONS[phase])] = draw(valid_ratio)
        if draw(st.integers(0, 2)) == 0:
            flags[dest(MEMORY_BUDGET_OPTIONS[phase])] = draw(valid_budget)
        if draw(st.integers(0, 2)) == 0:
            flags[dest(CAPTURE_POLICY_OPTIONS[phase])] = draw(valid_capture_policy)
    for switch in (
        "debug_cuda_graph",
        "enable_cudagraph_gc",
        "disable_cuda_graph_padding",
        "enable_profile_cuda_graph",
    ):
        if draw(st.booleans()):
            flags[switch] = True
    return flags


def json_mode(flags: FlagSet) -> tuple[str, dict[str, object]]:
    """The JSON flag of a valid flag set (its option) and its phase entries (a backend name or an object of
    settings); ``("", {})`` if none."""
    for name in sorted(JSON_DESTS & set(flags)):
        return FLAGS_BY_DEST[name].option, json.loads(str(flags[name]))
    return "", {}


def json_backends(flags: FlagSet) -> dict[str, str]:
    """The backends the JSON flag of a valid flag set gives, by phase name (a string entry, or an object's
    ``backend``): the phases it locks against compatibility rules."""
    backends = {}
    for phase, entry in json_mode(flags)[1].items():
        backend = entry.get("backend") if isinstance(entry, dict) else entry
        if backend is not None:
            backends[phase] = str(backend)
    return backends


flag_sets = st.one_of(valid_flag_sets(), any_flag_sets())
"""Any flag set: mostly valid ones that meet and override each other, or any values at all."""


PHASE_JSON_KEY_NAMES = [row.name for row in PHASE_JSON_KEYS]


environments = st.builds(
    Environment,
    device_type=st.sampled_from(["cuda", "cuda", "cuda:1", "cpu", "mps"]),
    pipeline_parallel_size=st.sampled_from([1, 1, 2, 4]),
    lora=st.booleans(),
    multimodal=st.booleans(),
    mla_attention=st.booleans(),
    torch_compile=st.booleans(),
    gpu_memory_gib=st.sampled_from([None, 16, 24, 40, 80, 141]),
)
