"""Properties of the graph-sizing settings over generated flag sets: the largest size is always a bucket, padding
ratios and memory budgets climb the precedence ladder (``--cuda-graph-mode`` JSON object > per-phase flag > default;
there is no both-phases flag), a phase's JSON object with only a backend reads like the backend's name, bad values
are one ``ConfigError`` naming the flag, and the compile cache directory is kept and marked unused exactly when
nothing compiles.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from config_flagsets import (
    JUNK_BUDGETS,
    JUNK_RATIOS,
    FlagSet,
    dest,
    environments,
    flag_sets,
    json_mode,
    valid_budget,
    valid_directory,
    valid_flag_sets,
    valid_ratio,
    valid_ratio_number,
    via_cli,
    via_keywords,
)
from hypothesis import assume, example, given
from hypothesis import strategies as st

from cudagraph.config import (
    Backend,
    CudaGraphConfig,
    Environment,
    MemoryBudget,
    OverriddenSettingWarning,
    Phase,
    read_memory_budget,
)
from cudagraph.config.flags import (
    COMPILE_CACHE_DIR_OPTION,
    MEMORY_BUDGET_OPTIONS,
    MODE_OPTION,
    PADDING_RATIO_OPTIONS,
)
from cudagraph.config.values import read_padding_ratio


@given(flag_sets, st.one_of(st.none(), environments))
@example({"decode_cuda_graph_bs": ["1", "2", "4"], "decode_cuda_graph_max_bs": "64"}, None)
@example({"cudagraph_capture_sizes": ["3"], "cuda_graph_max_bs": "500"}, None)
def test_the_largest_size_is_always_a_bucket(flags: FlagSet, environment: Environment | None) -> None:
    config, _, _ = via_cli(flags, environment)
    assume(config is not None)
    assert config is not None
    for phase in Phase:
        phase_config = config.for_phase(phase)
        if phase_config.enabled:
            assert phase_config.buckets[-1] == phase_config.max_size
            assert list(phase_config.buckets) == sorted(set(phase_config.buckets))
            assert phase_config.bucket_for(phase_config.max_size) in (phase_config.max_size, None)
        else:
            assert (phase_config.buckets, phase_config.max_size) == ((), 0)
            assert (phase_config.max_padding_ratio, phase_config.memory_budget) == (None, None)
            for name in ("buckets", "max_size", "max_padding_ratio", "memory_budget"):
                assert config.sources[f"{phase}.{name}"] == f"derived from {phase}.backend disabled"


@dataclass(frozen=True)
class Setting:
    """A per-phase sizing setting: its ``PhaseConfig`` field (also its JSON key), its flags and how values read."""

    name: str
    options: dict[Phase, str]
    flag_values: st.SearchStrategy[object]
    json_values: st.SearchStrategy[object]
    junk: st.SearchStrategy[object]

    def read(self, raw: object) -> object:
        if self.name == "max_padding_ratio":
            return read_padding_ratio("", raw)
        return read_memory_budget("", raw)


SETTINGS = (
    Setting(
        "max_padding_ratio",
        dict(PADDING_RATIO_OPTIONS),
        valid_ratio,
        st.one_of(valid_ratio_number, valid_ratio),
        st.sampled_from(JUNK_RATIOS),
    ),
    Setting(
        "memory_budget",
        dict(MEMORY_BUDGET_OPTIONS),
        valid_budget,
        st.one_of(valid_budget, st.sampled_from([2, 0.5, 1])),
        st.sampled_from(JUNK_BUDGETS),
    ),
)


def _without(flags: FlagSet, setting: Setting, phase: Phase) -> tuple[FlagSet, str, dict[str, object]]:
    """``flags`` with nothing that gives ``setting`` for ``phase``; with the JSON flag's option and entries."""
    flags = dict(flags)
    flags.pop(dest(setting.options[phase]), None)
    option, mode = json_mode(flags)
    entry = mode.get(phase.value)
    if isinstance(entry, dict):
        entry.pop(setting.name, None)
        flags[dest(option)] = json.dumps(mode)
    return flags, option, mode


def _with_json_entry(
    flags: FlagSet, option: str, mode: dict[str, object], phase: Phase, name: str, value: object
) -> tuple[FlagSet, str]:
    """``flags`` whose JSON flag (``--cuda-graph-mode`` when there is none) gives ``name`` for ``phase``, with any
    backend it gave kept: the string form becomes ``{"backend": ...}``."""
    option = option or MODE_OPTION
    entry = mode.get(phase.value)
    entry = dict(entry) if isinstance(entry, dict) else ({} if entry is None else {"backend": entry})
    mode = {**mode, phase.value: {**entry, name: value}}
    return {**flags, dest(option): json.dumps(mode)}, option


@st.composite
def ladders(draw: st.DrawFn) -> tuple[Phase, Setting, object, object, str, FlagSet]:
    """A valid flag set where one phase's setting is given by its JSON object, its per-phase flag, both or neither;
    with the phase, the setting, the JSON value and the flag value (``None``: not given) and the JSON option."""
    phase = draw(st.sampled_from(list(Phase)))
    setting = draw(st.sampled_from(SETTINGS))
    flags, option, mode = _without(draw(valid_flag_sets()), setting, phase)
    json_value = draw(st.one_of(st.none(), setting.json_values))
    flag_value = draw(st.one_of(st.none(), setting.flag_values))
    if json_value is not None:
        flags, option = _with_json_entry(flags, option, mode, phase, setting.name, json_value)
    if flag_value is not None:
        flags[dest(setting.options[phase])] = flag_value
    return phase, setting, json_value, flag_value, option, flags


@given(ladders(), environments)
@example(
    (
        Phase.DECODE,
        SETTINGS[0],
        1.5,
        "2",
        MODE_OPTION,
        {"cuda_graph_mode": '{"decode": {"max_padding_ratio": 1.5}}', "decode_cuda_graph_max_padding_ratio": "2"},
    ),
    Environment(),
)
def test_json_object_outranks_the_per_phase_flag_which_outranks_the_default(
    case: tuple[Phase, Setting, object, object, str, FlagSet], environment: Environment
) -> None:
    phase, setting, json_value, flag_value, option, flags = case
    config, error, caught = via_cli(flags, environment)
    assume(config is not None)  # other flags of the set may still disagree
    assert config is not None and error is None
    key = f"{phase}.{setting.name}"
    value, source = getattr(config.for_phase(phase), setting.name), config.sources[key]
    if not config.for_phase(phase).enabled:
        assert value is None and source == f"derived from {phase}.backend disabled"
    elif json_value is not None:
        assert value == setting.read(json_value) and source == f"json {option}"
    elif flag_value is not None:
        assert value == setting.read(flag_value) and source == f"flag {setting.options[phase]}"
    else:
        assert value is None and source == "default"
    overrides = [message for category, message in caught if category is OverriddenSettingWarning]
    disagree = None not in (json_value, flag_value) and setting.read(json_value) != setting.read(flag_value)
    assert [message for message in overrides if message.startswith(f"{key}: ")] == (
        [f"{key}: {option} {setting.read(json_value)} overrides {setting.options[phase]} {setting.read(flag_value)}"]
        if disagree
        else []
    )


@st.composite
def object_spellings(draw: st.DrawFn) -> tuple[FlagSet, FlagSet]:
    """Any flag set with a JSON flag whose phases are backend names (valid or not), and the same set with some of
    them written as ``{"backend": name}``."""
    flags = draw(flag_sets)
    option = draw(st.sampled_from([MODE_OPTION, "--cuda-graph-config"]))
    mode = draw(
        st.dictionaries(
            st.sampled_from(["decode", "prefill", "dcode"]),
            st.sampled_from(["full", "breakable", "tc_piecewise", "disabled", "tcpcg", "FULL", ""]),
            min_size=1,
        )
    )
    flags = {name: raw for name, raw in flags.items() if name not in ("cuda_graph_mode", "cuda_graph_config")}
    objects = draw(st.sets(st.sampled_from(sorted(mode)), min_size=1))
    as_objects = {phase: ({"backend": backend} if phase in objects else backend) for phase, backend in mode.items()}
    return {**flags, dest(option): json.dumps(mode)}, {**flags, dest(option): json.dumps(as_objects)}


@given(object_spellings(), environments)
def test_a_phase_object_with_only_a_backend_reads_like_the_backend_name(
    case: tuple[FlagSet, FlagSet], environment: Environment
) -> None:
    strings, objects = case
    for route in (via_cli, via_keywords):
        expected, result = route(strings, environment), route(objects, environment)
        assert result == expected  # config, error and warnings
        if result[0] is not None and expected[0] is not None:
            assert dict(result[0].sources) == dict(expected[0].sources)


@st.composite
def bad_values(draw: st.DrawFn) -> tuple[FlagSet, str]:
    """A valid flag set that resolves, plus one bad sizing value (a flag's, or a phase object's key or value); with
    the label its error must start with."""
    phase = draw(st.sampled_from(list(Phase)))
    setting = draw(st.sampled_from(SETTINGS))
    target = draw(st.sampled_from(["flag", "json", "json key", "cache dir"]))
    flags, option, mode = _without(draw(valid_flag_sets()), setting, phase)
    flags.pop(dest(COMPILE_CACHE_DIR_OPTION), None)
    assume(via_cli(flags)[0] is not None)
    if target == "flag":
        flags[dest(setting.options[phase])] = draw(setting.junk)
        return flags, f"{setting.options[phase]}: "
    if target == "cache dir":
        flags[dest(COMPILE_CACHE_DIR_OPTION)] = ""
        return flags, f"{COMPILE_CACHE_DIR_OPTION}: "
    if target == "json":
        junk = draw(st.one_of(setting.junk, st.sampled_from([None, True, [1], {"GiB": 2}])))
        flags, option = _with_json_entry(flags, option, mode, phase, setting.name, junk)
        return flags, f"{option} {phase}.{setting.name}: "
    key = draw(st.sampled_from(["max_padding", "memory", "Backend", "buckets", "max_size", ""]))
    flags, option = _with_json_entry(flags, option, mode, phase, key, 2)
    return flags, f"{option}: unknown key {key!r} in the {phase} object; allowed keys: "


@given(bad_values(), environments)
@example(({"decode_cuda_graph_max_padding_ratio": "0.5"}, "--decode-cuda-graph-max-padding-ratio: "), Environment())
@example(
    ({"cuda_graph_mode": '{"prefill": {"memory_budget": "120%"}}'}, "--cuda-graph-mode prefill.memory_budget: "),
    Environment(),
)
def test_a_bad_sizing_value_is_one_error_naming_its_flag(case: tuple[FlagSet, str], environment: Environment) -> None:
    flags, label = case
    results = [route(flags, environment) for route in (via_cli, via_keywords)]
    for config, error, caught in results:
        assert config is None and caught == []
        assert error is not None and error.startswith(label), error
        assert "allowed" in error and "\n" not in error
    assert results[0][1] == results[1][1]


@given(valid_flag_sets(), valid_directory, environments)
@example({"prefill_cuda_graph_backend": "tc_piecewise", "tc_piecewise_compiler": "inductor"}, "/c", Environment())
@example({"torch_compile_max_bs": "8", "decode_disable_cuda_graph": True}, "-c", Environment())
def test_a_compile_cache_dir_is_kept_and_marked_unused_exactly_when_nothing_compiles(
    flags: FlagSet, directory: str, environment: Environment
) -> None:
    base = {name: value for name, value in flags.items() if name != dest(COMPILE_CACHE_DIR_OPTION)}
    plain, _, _ = via_cli(base, environment)
    assume(plain is not None)
    assert plain is not None
    config, error, _ = via_cli({**base, dest(COMPILE_CACHE_DIR_OPTION): directory}, environment)
    # The directory never makes input invalid, changes nothing else, and is kept as written.
    assert error is None and config == CudaGraphConfig(**{**vars(plain), "compile_cache_dir": directory})
    compiled_buckets = config.torch_compile_max_bs > 0 and config.decode.backend is Backend.FULL
    inductor_pieces = config.tc_piecewise_compiler == "inductor" and Backend.TC_PIECEWISE in {
        config.backend(phase) for phase in Phase
    }
    source = config.sources["compile_cache_dir"]
    assert source.startswith(f"flag {COMPILE_CACHE_DIR_OPTION}")
    assert ("(unused: nothing compiles with inductor" in source) is not (compiled_buckets or inductor_pieces)


budgets = st.one_of(
    st.builds(MemoryBudget, bytes=st.integers(1, 2**50)),
    st.builds(
        MemoryBudget,
        free_fraction=st.floats(0, 1, exclude_min=True, allow_nan=False).filter(lambda share: share > 0),
    ),
)


@given(budgets)
@example(MemoryBudget(bytes=1610612736))
@example(MemoryBudget(free_fraction=0.07))
@example(MemoryBudget(free_fraction=5e-324))
def test_a_budget_reads_back_from_its_spelling(budget: MemoryBudget) -> None:
    spelling = str(budget)
    assert read_memory_budget("budget", spelling) == budget
    assert spelling.endswith(("%", "B", "GiB", "GB", "MiB", "MB", "KiB", "kB"))
