"""Properties of ``cudagraph.config.resolve`` over generated flag sets (JSON, per-phase, other engines' spellings,
legacy, keywords, any mix).

Run longer with ``HYPOTHESIS_PROFILE=deep`` (or ``--hypothesis-profile=deep``).
"""

from __future__ import annotations

import json
import re
from collections import Counter

from config_flagsets import (
    ALIASES_OF,
    ALL_OPTIONS,
    JSON_DESTS,
    LEGACY_BACKEND_SPELLINGS,
    FlagSet,
    Outcome,
    argv,
    canonical_option,
    dest,
    environments,
    flag_sets,
    json_backends,
    json_mode,
    outcome,
    parse,
    sample_value,
    spellings,
    valid_flag_sets,
    value_strategy,
    via_cli,
    via_keywords,
)
from hypothesis import assume, example, given
from hypothesis import strategies as st

from cudagraph.config import (
    ALIAS_FLAGS,
    ALLOWED_BACKENDS_PER_PHASE,
    LEGACY_FLAGS,
    TORCH_COMPILE_MODES,
    VLLM_CUDAGRAPH_MODES,
    VLLM_FLAGS,
    Backend,
    CudaGraphConfig,
    Environment,
    LegacyFlagWarning,
    Phase,
    resolve,
)
from cudagraph.config.flags import FLAGS_BY_DEST, MODE_OPTION, AliasFlag, LegacyFlag
from cudagraph.config.phase_config import PHASE_FIELDS


@given(flag_sets, st.one_of(st.none(), environments))
@example({"cuda_graph_mode": '{"decode": {}}'}, None)  # an unhashable JSON value is an unknown backend, not a TypeError
@example({"cuda_graph_mode": "null"}, None)
def test_resolution_is_total(flags: FlagSet, environment: Environment | None) -> None:
    # outcome() lets only ConfigError through as a result; anything else raises here and fails the test.
    for route in (via_cli, via_keywords):
        config, error, _ = route(flags, environment)
        assert (config is None) != (error is None)


@given(flag_sets, st.one_of(st.none(), environments))
@example({"decode_cuda_graph_bs": ["-1"]}, None)  # "-1" on a command line is a value, not an option
@example({"cuda_graph_bs": ["007"]}, None)
def test_keywords_and_command_line_agree(flags: FlagSet, environment: Environment | None) -> None:
    cli_config, cli_error, cli_warnings = via_cli(flags, environment)
    kw_config, kw_error, kw_warnings = via_keywords(flags, environment)
    assert cli_error == kw_error
    assert cli_config == kw_config
    assert cli_warnings == kw_warnings
    if cli_config is not None and kw_config is not None:
        assert dict(cli_config.sources) == dict(kw_config.sources)


@given(valid_flag_sets(), environments)
@example({"cuda_graph_mode": '{"decode": "full"}', "decode_disable_cuda_graph": True}, Environment(device_type="cpu"))
@example({"cuda_graph_config": '{"prefill": "tc_piecewise"}', "disable_prefill_cuda_graph": True}, Environment())
def test_json_entry_wins_for_its_phase(flags: FlagSet, environment: Environment) -> None:
    config, _, _ = via_cli(flags, environment)
    assume(config is not None)
    assert config is not None
    option = json_mode(flags)[0]
    for phase_name, backend_name in json_backends(flags).items():
        assert config.backend(phase_name) is Backend(backend_name)
        assert config.sources[f"{phase_name}.backend"] == f"json {option}"


# Flags whose every claim concerns one phase only (their other engines' spellings are added below).
PHASE_ONLY_FLAGS = {
    Phase.DECODE: [
        "--decode-cuda-graph-backend",
        "--decode-disable-cuda-graph",
        "--decode-cuda-graph-bs",
        "--decode-cuda-graph-max-bs",
        "--cuda-graph-bs",
        "--cuda-graph-max-bs",
        "--decode-cuda-graph-max-padding-ratio",
        "--decode-cuda-graph-memory-budget",
        "--decode-cuda-graph-capture-policy",
    ],
    Phase.PREFILL: [
        "--prefill-cuda-graph-backend",
        "--prefill-disable-cuda-graph",
        "--prefill-cuda-graph-tokens",
        "--prefill-cuda-graph-max-tokens",
        "--disable-piecewise-cuda-graph",
        "--enable-breakable-cuda-graph",
        "--enforce-piecewise-cuda-graph",
        "--piecewise-cuda-graph-tokens",
        "--piecewise-cuda-graph-max-tokens",
        "--prefill-cuda-graph-max-padding-ratio",
        "--prefill-cuda-graph-memory-budget",
        "--prefill-cuda-graph-capture-policy",
    ],
}
for _options in PHASE_ONLY_FLAGS.values():
    _options += [alias for option in list(_options) for alias in ALIASES_OF.get(option, [])]


@st.composite
def phase_only_flags(draw: st.DrawFn) -> tuple[Phase, FlagSet]:
    phase = draw(st.sampled_from(list(Phase)))
    options = draw(st.lists(st.sampled_from(PHASE_ONLY_FLAGS[phase]), min_size=1, max_size=4, unique=True))
    return phase, {dest(option): draw(value_strategy(option, valid=draw(st.booleans()))) for option in options}


@given(valid_flag_sets(), phase_only_flags(), environments)
def test_flags_for_one_phase_never_change_the_other(
    base: FlagSet, extra: tuple[Phase, FlagSet], environment: Environment
) -> None:
    phase, phase_flags = extra
    other = Phase.PREFILL if phase is Phase.DECODE else Phase.DECODE
    before, _, _ = via_cli(base, environment)
    after, _, _ = via_cli({**base, **phase_flags}, environment)
    assume(before is not None and after is not None)
    assert before is not None and after is not None
    assert after.for_phase(other) == before.for_phase(other)
    for field_name in PHASE_FIELDS:
        assert after.sources[f"{other}.{field_name}"] == before.sources[f"{other}.{field_name}"]


def _keys_touched(name: str) -> set[str]:
    """The settings keys a flag can claim, found by reading a valid value that claims all of them."""
    flag = FLAGS_BY_DEST[name]
    return set(flag.read(flag.option, sample_value(flag.option), []))


def _modern_equivalent(legacy: LegacyFlag, raw: object) -> FlagSet:
    return {dest(option): (raw if value is None else value) for option, value in legacy.replacement}


@st.composite
def legacy_cases(draw: st.DrawFn) -> tuple[LegacyFlag, object, FlagSet]:
    legacy = draw(st.sampled_from(LEGACY_FLAGS))
    raw = draw(value_strategy(legacy.option, valid=draw(st.booleans())))
    touched = _keys_touched(legacy.dest)
    base = {
        name: value
        for name, value in draw(valid_flag_sets()).items()
        if name in JSON_DESTS or not (_keys_touched(name) & touched)
    }
    return legacy, raw, base


@given(legacy_cases(), environments)
@example(  # a legacy switch with a fixed modern value, under a JSON entry for the same phase
    (
        next(f for f in LEGACY_FLAGS if f.option == "--enable-breakable-cuda-graph"),
        True,
        {"cuda_graph_mode": '{"prefill": "tc_piecewise"}'},
    ),
    Environment(mla_attention=True),
)
def test_each_legacy_flag_resolves_like_its_modern_equivalent(
    case: tuple[LegacyFlag, object, FlagSet], environment: Environment
) -> None:
    legacy, raw, base = case
    old_config, old_error, old_warnings = via_cli({**base, legacy.dest: raw}, environment)
    new_config, new_error, new_warnings = via_cli({**base, **_modern_equivalent(legacy, raw)}, environment)
    assert old_config == new_config
    assert (old_error is None) == (new_error is None)
    if old_error is None:
        deprecations = Counter(m for category, m in old_warnings if category is LegacyFlagWarning)
        deprecations.subtract(m for category, m in new_warnings if category is LegacyFlagWarning)
        assert +deprecations == Counter([legacy.deprecation_message()])


TC_PIECEWISE = Backend.TC_PIECEWISE.value


def _respell(draw: st.DrawFn, value: str, used: list[str]) -> str:
    if value != TC_PIECEWISE:
        return value
    spelling = draw(st.sampled_from([TC_PIECEWISE, *LEGACY_BACKEND_SPELLINGS]))
    used.append(spelling)
    return spelling


@st.composite
def legacy_value_cases(draw: st.DrawFn) -> tuple[FlagSet, FlagSet, set[str]]:
    """A valid flag set that says ``tc_piecewise`` in at least one place (JSON or a per-phase backend flag, in any
    spelling), the same set with a legacy value spelling in that place and any spelling in the others, and the legacy
    spellings used."""
    flags = draw(valid_flag_sets())
    phase = draw(st.sampled_from(list(Phase)))
    forced = draw(st.sampled_from(LEGACY_BACKEND_SPELLINGS))
    used = [forced]
    if draw(st.booleans()):
        option, mode = json_mode(flags)
        name = dest(option or draw(st.sampled_from([MODE_OPTION, *ALIASES_OF[MODE_OPTION]])))
        mode[phase.value] = TC_PIECEWISE
        flags[name] = json.dumps(mode)
        spelled = dict(flags)
        others = {key: _respell(draw, value, used) for key, value in mode.items() if key != phase.value}
        spelled[name] = json.dumps({**mode, **others, phase.value: forced})
    else:
        for option in (f"--{phase.value}-cuda-graph-backend", f"--{phase.value}-disable-cuda-graph"):
            for name in spellings(option):
                flags.pop(name, None)
        name = draw(st.sampled_from(spellings(f"--{phase.value}-cuda-graph-backend")))
        flags[name] = TC_PIECEWISE
        spelled = {**flags, name: forced}
    for other in Phase:
        for name in spellings(f"--{other.value}-cuda-graph-backend"):
            if name in flags and spelled[name] == flags[name]:
                spelled[name] = _respell(draw, str(flags[name]), used)
    return flags, spelled, set(used) - {TC_PIECEWISE}


@given(legacy_value_cases(), environments)
@example(
    (
        {"cuda_graph_mode": '{"decode": "tc_piecewise"}', "prefill_cuda_graph_backend": "tc_piecewise"},
        {"cuda_graph_mode": '{"decode": "tcpcg"}', "prefill_cuda_graph_backend": "tcpcg"},
        {"tcpcg"},
    ),
    Environment(),
)
def test_legacy_value_spellings_resolve_like_tc_piecewise_and_warn_once_each(
    case: tuple[FlagSet, FlagSet, set[str]], environment: Environment
) -> None:
    canonical, spelled, legacy_spellings = case
    assert legacy_spellings
    expected, expected_error, expected_warnings = via_cli(canonical, environment)
    for route in (via_cli, via_keywords):
        config, error, caught = route(spelled, environment)
        assert config == expected and error == expected_error
        if error is not None:
            assert caught == []  # a failed resolution warns about nothing
            continue
        assert config is not None and expected is not None
        extra = Counter(caught)
        extra.subtract(expected_warnings)
        assert -extra == Counter()  # every warning of the canonical spelling is still there
        added = list((+extra).elements())
        assert {category for category, _ in added} == {LegacyFlagWarning}
        assert sorted(message.split("'")[1] for _, message in added) == sorted(legacy_spellings)
        assert all(message.endswith("use 'tc_piecewise' instead") for _, message in added)
        for key, source in config.sources.items():
            assert source == expected.sources[key] or source.startswith(f"{expected.sources[key]} (legacy value '")


# --- other engines' spellings ------------------------------------------------------------------------------------

ALIASES = {alias.option: alias for alias in ALIAS_FLAGS}


@st.composite
def alias_cases(draw: st.DrawFn) -> tuple[FlagSet, FlagSet, list[AliasFlag]]:
    """Any flag set that gives one to three modern flags which have other spellings, and the same set with those
    flags spelled the other way (value unchanged)."""
    flags = draw(flag_sets)
    aliases = draw(st.lists(st.sampled_from(ALIAS_FLAGS), min_size=1, max_size=3, unique_by=lambda a: a.canonical))
    for alias in aliases:
        for name in spellings(alias.canonical):  # the respelled flag is the only spelling of its modern flag
            flags.pop(name, None)
        flags[dest(alias.canonical)] = draw(value_strategy(alias.canonical, valid=draw(st.booleans())))
    respelled = {}
    for name, value in flags.items():
        alias = next((a for a in aliases if dest(a.canonical) == name), None)
        respelled[alias.dest if alias else name] = value
    return flags, respelled, aliases


def _in_modern_spelling(result: Outcome, aliases: list[AliasFlag]) -> Outcome:
    def modern(text: str) -> str:
        for alias in aliases:
            text = re.sub(rf"{re.escape(alias.option)}\b(?!-)", alias.canonical, text)
        return text

    config, error, caught = result
    if config is not None:
        config = type(config)(**{**vars(config), "sources": {k: modern(v) for k, v in config.sources.items()}})
    return config, None if error is None else modern(error), [(c, modern(m)) for c, m in caught]


@given(alias_cases(), environments)
@example(
    (
        {"decode_cuda_graph_backend": "x", "prefill_cuda_graph_backend": "y"},
        {"cuda_graph_backend_decode": "x", "prefill_cuda_graph_backend": "y"},
        [ALIASES["--cuda-graph-backend-decode"]],
    ),
    Environment(),
)
def test_each_alias_resolves_exactly_like_its_modern_flag(
    case: tuple[FlagSet, FlagSet, list[AliasFlag]], environment: Environment
) -> None:
    # Same config, same error, same warnings, same sources: only the flag's name differs where it is shown.
    flags, respelled, aliases = case
    expected = via_cli(flags, environment)
    for route in (via_cli, via_keywords):
        result = route(respelled, environment)
        assert result[0] == expected[0]
        modern = _in_modern_spelling(result, aliases)
        assert modern[1:] == expected[1:]
        if modern[0] is not None and expected[0] is not None:
            assert dict(modern[0].sources) == dict(expected[0].sources)


def _vllm_modern_equivalent(name: str, raw: object) -> FlagSet:
    """The per-phase flags that say what one vLLM spelling says, from the design card's table."""
    if name == "enforce_eager":
        return {"decode_disable_cuda_graph": True, "prefill_disable_cuda_graph": True}
    if name == "cudagraph_mode":
        mode = VLLM_CUDAGRAPH_MODES[str(raw).upper()]
        return {f"{phase.value}_cuda_graph_backend": mode[phase].value for phase in Phase}
    compilation = json.loads(str(raw))
    flags: FlagSet = {}
    if compilation.get("cudagraph_mode") is not None:
        flags.update(_vllm_modern_equivalent("cudagraph_mode", compilation["cudagraph_mode"]))
    if compilation.get("cudagraph_capture_sizes") is not None:
        flags["decode_cuda_graph_bs"] = [str(size) for size in compilation["cudagraph_capture_sizes"]]
    if compilation.get("max_cudagraph_capture_size") is not None:
        flags["decode_cuda_graph_max_bs"] = str(compilation["max_cudagraph_capture_size"])
    return flags


@st.composite
def vllm_cases(draw: st.DrawFn) -> tuple[FlagSet, str, object, FlagSet]:
    """A vLLM spelling with a valid value, its per-phase equivalent, and valid flags of the other levels (and of
    this level on other settings) to meet them."""
    name = draw(st.sampled_from([dest(flag.option) for flag in VLLM_FLAGS]))
    raw = draw(value_strategy(FLAGS_BY_DEST[name].option, valid=True))
    modern = _vllm_modern_equivalent(name, raw)
    touched = set().union(*(_keys_touched(option) for option in modern), _keys_touched(name))
    base = {
        flag_name: value
        for flag_name, value in draw(valid_flag_sets()).items()
        if flag_name in JSON_DESTS
        or isinstance(FLAGS_BY_DEST[flag_name], LegacyFlag)
        or not (_keys_touched(flag_name) & touched)
    }
    return base, name, raw, modern


@given(vllm_cases(), environments)
@example(({"cuda_graph_mode": '{"decode": "breakable"}'}, "cudagraph_mode", "full_and_piecewise", {}), Environment())
@example(({"disable_cuda_graph": True}, "compilation_config", '{"cudagraph_capture_sizes": [4, 1]}', {}), Environment())
def test_each_vllm_spelling_resolves_like_its_per_phase_flags(
    case: tuple[FlagSet, str, object, FlagSet], environment: Environment
) -> None:
    base, name, raw, modern = case
    modern = modern or _vllm_modern_equivalent(name, raw)  # the explicit examples leave it to be derived
    expected, expected_error, expected_warnings = via_cli({**base, **modern}, environment)
    for route in (via_cli, via_keywords):
        config, error, caught = route({**base, name: raw}, environment)
        assert config == expected
        assert (error is None) == (expected_error is None)
        assert Counter(category for category, _ in caught) == Counter(category for category, _ in expected_warnings)


SAME_LEVEL_OPTIONS = [option for option in ALL_OPTIONS if not isinstance(FLAGS_BY_DEST[dest(option)], LegacyFlag)]


def _claims_of(option: str, raw: object) -> dict[str, object]:
    return FLAGS_BY_DEST[dest(option)].read(option, raw, [])


def _allowed_backends(phase: Phase) -> list[str]:
    return [backend.value for backend in Backend if backend in ALLOWED_BACKENDS_PER_PHASE[phase]]


def _valid_value(draw: st.DrawFn, option: str, phase: Phase) -> object:
    canonical = canonical_option(option)
    if canonical == MODE_OPTION:  # a JSON object that names the phase in question
        return json.dumps({phase.value: draw(st.sampled_from(_allowed_backends(phase)))})
    if canonical.endswith("-backend"):
        return draw(st.sampled_from(_allowed_backends(Phase(canonical.split("-")[2]))))
    return draw(value_strategy(option, valid=True))


@st.composite
def same_level_conflicts(draw: st.DrawFn) -> tuple[FlagSet, str, str, set[str]]:
    """Two flags of one precedence level (modern or another engine's spelling) that claim one setting with different
    values, on top of valid flags that resolve alone and claim none of their settings; with the two options and the
    settings keys they disagree on."""
    phase = draw(st.sampled_from(list(Phase)))
    first = draw(st.sampled_from(SAME_LEVEL_OPTIONS))
    first_value = _valid_value(draw, first, phase)
    first_claims = _claims_of(first, first_value)
    rivals = [
        option
        for option in SAME_LEVEL_OPTIONS
        if option != first
        and FLAGS_BY_DEST[dest(option)].kind is FLAGS_BY_DEST[dest(first)].kind
        and set(_claims_of(option, sample_value(option))) & set(first_claims)
    ]
    assume(rivals)
    second = draw(st.sampled_from(rivals))
    second_value = _valid_value(draw, second, phase)
    second_claims = _claims_of(second, second_value)
    disagreements = {
        key for key in first_claims.keys() & second_claims.keys() if first_claims[key] != second_claims[key]
    }
    assume(disagreements)
    base = draw(valid_flag_sets())
    assume(via_cli(base)[1] is None)
    claimed = first_claims.keys() | second_claims.keys()
    base = {name: raw for name, raw in base.items() if not (set(_claims_of(FLAGS_BY_DEST[name].option, raw)) & claimed)}
    return {**base, dest(first): first_value, dest(second): second_value}, first, second, disagreements


SAME_LEVEL_ERROR = re.compile(
    r"(?P<key>[a-z_.]+): (?P<first>--[a-z-]+) gives (?P<first_value>.+) but (?P<second>--[a-z-]+) gives "
    r"(?P<second_value>.+); both have the same precedence, so give only one"
)


@given(same_level_conflicts(), environments)
def test_same_level_disagreement_is_one_error_naming_both_flags(
    case: tuple[FlagSet, str, str, set[str]], environment: Environment
) -> None:
    flags, first, second, disagreements = case
    for route in (via_cli, via_keywords):
        config, error, caught = route(flags, environment)
        assert config is None and caught == []
        assert error is not None
        match = SAME_LEVEL_ERROR.fullmatch(error)
        assert match is not None, error
        assert match["key"] in disagreements
        assert {match["first"], match["second"]} == {first, second}


# --- round trip and rules -----------------------------------------------------------------------------------------


@given(flag_sets, environments, environments)
@example({"decode_cuda_graph_bs": ["3"], "decode_cuda_graph_max_bs": "500"}, Environment(), Environment())
@example({"decode_cuda_graph_max_bs": "300"}, Environment(), Environment())  # the cap lies off the schedule
def test_to_cli_args_resolves_back_to_an_equal_config(
    flags: FlagSet, environment: Environment, other_environment: Environment
) -> None:
    config, _, _ = via_cli(flags, environment)
    assume(config is not None)
    assert config is not None
    args = config.to_cli_args()
    again, error, caught = outcome(lambda: resolve(parse(args), environment=other_environment))
    assert error is None and again == config and caught == []
    assert resolve(parse(args)) == config


@given(flag_sets, environments)
@example({"prefill_cuda_graph_backend": "tc_piecewise", "debug_cuda_graph": True}, Environment())
@example({"cuda_graph_mode": '{"prefill": "breakable"}'}, Environment(mla_attention=True, device_type="cpu"))
def test_rules_only_turn_unlocked_phases_off(flags: FlagSet, environment: Environment) -> None:
    plain, plain_error, _ = via_cli(flags, Environment())
    ruled, ruled_error, _ = via_cli(flags, environment)
    assert plain_error == ruled_error  # the environment never makes input valid or invalid
    if plain is None or ruled is None:
        return
    locked = json_backends(flags) if plain_error is None else {}
    for phase in Phase:
        before, after = plain.backend(phase), ruled.backend(phase)
        if phase.value in locked:
            assert after is before
        elif after is not before:
            assert after is Backend.DISABLED
            assert ruled.sources[f"{phase}.backend"].startswith("rule ")
        # A phase a rule leaves on keeps its padding ratio and budget; one it turns off has none.
        limits = (ruled.for_phase(phase).max_padding_ratio, ruled.for_phase(phase).memory_budget)
        if after is Backend.DISABLED:
            assert limits == (None, None)
        else:
            assert limits == (plain.for_phase(phase).max_padding_ratio, plain.for_phase(phase).memory_budget)
    assert (
        ruled.tc_piecewise_compiler,
        ruled.torch_compile_max_bs,
        ruled.torch_compile_mode,
        ruled.compile_cache_dir,
        ruled.debug,
        ruled.enable_gc,
        ruled.disable_padding,
    ) == (
        plain.tc_piecewise_compiler,
        plain.torch_compile_max_bs,
        plain.torch_compile_mode,
        plain.compile_cache_dir,
        plain.debug,
        plain.enable_gc,
        plain.disable_padding,
    )


_TORCH_COMPILE_DESTS = ("torch_compile_max_bs", "enable_torch_compile")


@given(valid_flag_sets(), st.sampled_from([(), ("max",), ("enable",), ("max", "enable")]), st.integers(1, 512))
@example({"decode_cuda_graph_backend": "breakable"}, ("enable",), 8)
@example({"disable_cuda_graph": True}, ("max",), 8)
def test_compiled_small_buckets_apply_to_full_decode_only(flags: FlagSet, given_flags: tuple[str, ...], n: int) -> None:
    base = {name: value for name, value in flags.items() if name not in _TORCH_COMPILE_DESTS}
    plain, plain_error, _ = via_cli(base)
    assume(plain is not None)
    assert plain is not None and plain_error is None
    with_compile = dict(base)
    if "max" in given_flags:
        with_compile["torch_compile_max_bs"] = str(n)
    if "enable" in given_flags:
        with_compile["enable_torch_compile"] = True
    config, error, _ = via_cli(with_compile)
    expected = (n if "max" in given_flags else 32) if given_flags else 0
    # The backend asked for: in the default environment the only rule that turns decode off is the debug one,
    # which applies to tc_piecewise.
    ruled_off = plain.sources["decode.backend"].startswith("rule debug_tc_piecewise")
    decode_backend = Backend.TC_PIECEWISE if ruled_off else plain.backend(Phase.DECODE)
    if expected and decode_backend not in (Backend.FULL, Backend.DISABLED):
        assert config is None and error is not None
        assert "full decode graphs" in error and str(decode_backend) in error
        assert ("--torch-compile-max-bs" if "max" in given_flags else "--enable-torch-compile") in error
        return
    assert error is None and config is not None
    assert config.torch_compile_max_bs == expected
    # Nothing else changes, and the setting says where it came from.
    assert config == CudaGraphConfig(**{**vars(plain), "torch_compile_max_bs": expected})
    source = config.sources["torch_compile_max_bs"]
    assert source == ("flag --torch-compile-max-bs" if "max" in given_flags else source)
    assert ("--enable-torch-compile" in source) == (given_flags == ("enable",))


@given(valid_flag_sets(), st.sampled_from(TORCH_COMPILE_MODES), environments)
@example({"decode_disable_cuda_graph": True, "torch_compile_max_bs": "8"}, "lite", Environment())
@example(
    {"prefill_cuda_graph_backend": "tc_piecewise", "tc_piecewise_compiler": "inductor"},
    "max-autotune-no-cudagraphs",
    Environment(lora=True),
)
def test_a_compile_mode_is_kept_and_marked_unused_exactly_when_nothing_compiles(
    flags: FlagSet, mode: str, environment: Environment
) -> None:
    base = {name: value for name, value in flags.items() if name != "torch_compile_mode"}
    plain, _, _ = via_cli(base, environment)
    assume(plain is not None)
    assert plain is not None
    config, error, _ = via_cli({**base, "torch_compile_mode": mode}, environment)
    # The mode never makes input invalid and changes nothing else.
    assert error is None and config == CudaGraphConfig(**{**vars(plain), "torch_compile_mode": mode})
    backends = {config.backend(phase) for phase in Phase}
    compiled_buckets = config.torch_compile_max_bs > 0 and config.decode.backend is Backend.FULL
    inductor_pieces = config.tc_piecewise_compiler == "inductor" and Backend.TC_PIECEWISE in backends
    source = config.sources["torch_compile_mode"]
    assert source.startswith("flag --torch-compile-mode")
    assert ("(unused: nothing compiles with inductor" in source) is not (compiled_buckets or inductor_pieces)


def test_strategies_produce_mostly_resolvable_sets() -> None:
    # Guards the properties above against passing vacuously: valid flag sets must usually resolve.
    from hypothesis import find, settings

    resolved = []

    @settings(max_examples=100, database=None)
    @given(valid_flag_sets())
    def collect(flags: FlagSet) -> None:
        resolved.append(via_cli(flags)[0] is not None)

    collect()
    assert sum(resolved) >= 0.6 * len(resolved)
    assert find(valid_flag_sets(), lambda f: "cuda_graph_mode" in f and len(f) > 4)  # JSON meets other flags
    assert argv({"decode_cuda_graph_bs": ["1"]}) == ["--decode-cuda-graph-bs", "1"]
