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

from hypothesis import strategies as st

from cudagraph.config import (
    ALIAS_FLAGS,
    LEGACY_BACKEND_VALUES,
    LEGACY_FLAGS,
    MODERN_FLAGS,
    Backend,
    ConfigError,
    CudaGraphConfig,
    Environment,
    Phase,
    add_cli_args,
    resolve,
)
from cudagraph.config.flags import FLAGS_BY_DEST, MODE_OPTION, AliasFlag, Arity, LegacyFlag

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
        if name in JSON_DESTS or raw is True:
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
valid_mode = st.dictionaries(st.sampled_from([phase.value for phase in Phase]), valid_backend).map(json.dumps)
any_mode = st.one_of(
    valid_mode,
    st.dictionaries(st.sampled_from(["decode", "prefill", "dcode"]), any_backend).map(json.dumps),
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

VALUE_STRATEGIES = {
    # arity or option -> (valid values, any values)
    Arity.SWITCH: (st.just(True), st.just(True)),
    MODE_OPTION: (valid_mode, any_mode),
    "backend": (valid_backend, any_backend),
    "sizes": (valid_sizes, any_sizes),
    "max": (valid_max, any_size),
    "compiler": (valid_compiler, any_compiler),
}


def _value_kind(option: str) -> object:
    flag = FLAGS_BY_DEST[dest(option)]
    if flag.arity is Arity.SWITCH:
        return Arity.SWITCH
    target = canonical_option(option)
    if target == MODE_OPTION:
        return target
    if target.endswith("-backend"):
        return "backend"
    if target.endswith("compiler"):
        return "compiler"
    return "sizes" if FLAGS_BY_DEST[dest(target)].arity is Arity.MANY else "max"


def value_strategy(option: str, *, valid: bool) -> st.SearchStrategy[object]:
    """Values of one flag: valid only, or with malformed ones mixed in."""
    valid_values, any_values = VALUE_STRATEGIES[_value_kind(option)]
    return valid_values if valid else any_values


ALL_OPTIONS = [*MODERN_FLAGS, *(flag.option for flag in (*ALIAS_FLAGS, *LEGACY_FLAGS))]


def any_flag_sets() -> st.SearchStrategy[FlagSet]:
    """Any mix of flags (JSON, per-phase, aliases, legacy) with values that may be malformed or contradict."""
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
    for phase in Phase:
        choice = draw(st.sampled_from(["none", "backend", "disable"]))
        if choice == "backend":
            allowed = [b for b in BACKEND_NAMES if not (phase is Phase.PREFILL and b == "full")]
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
    for switch in (
        "debug_cuda_graph",
        "enable_cudagraph_gc",
        "disable_cuda_graph_padding",
        "enable_profile_cuda_graph",
    ):
        if draw(st.booleans()):
            flags[switch] = True
    return flags


def json_mode(flags: FlagSet) -> tuple[str, dict[str, str]]:
    """The JSON flag of a valid flag set (its option) and its phase -> backend entries; ``("", {})`` if none."""
    for name in JSON_DESTS & set(flags):
        return FLAGS_BY_DEST[name].option, json.loads(str(flags[name]))
    return "", {}


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
