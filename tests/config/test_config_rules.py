"""Every compatibility rule: fires on its condition only, turns exactly its phase off, logs and records its name,
and never touches a phase locked by --cuda-graph-mode."""

from __future__ import annotations

import dataclasses
import logging

import pytest
from config_helpers import recorded_warnings

from cudagraph.config import COMPATIBILITY_RULES, Backend, CompatibilityRule, Environment, Phase, resolve

# For each rule name: the environment and flags that trigger it, on top of base flags under which the phase is graphed.
TRIGGERS: dict[str, tuple[Environment, dict[str, object], dict[str, object]]] = {
    "non_cuda_device": (Environment(device_type="cpu"), {}, {}),
    "pipeline_parallel": (Environment(pipeline_parallel_size=2), {}, {}),
    "lora": (Environment(lora=True), {}, {}),
    "multimodal": (Environment(multimodal=True), {}, {}),
    "torch_compile_whole_model": (Environment(torch_compile=True), {}, {}),
    "debug_tc_piecewise": (
        Environment(),
        {"debug_cuda_graph": True},
        {"decode_cuda_graph_backend": "tc_piecewise", "prefill_cuda_graph_backend": "tc_piecewise"},
    ),
    "mla_breakable": (Environment(mla_attention=True), {}, {"decode_cuda_graph_backend": "breakable"}),
}
RULE_IDS = [f"{rule.name}-{rule.phase}" for rule in COMPATIBILITY_RULES]


def test_issue_rules_are_all_in_the_table() -> None:
    assert {rule.name for rule in COMPATIBILITY_RULES} == set(TRIGGERS)
    rows = [(rule.name, rule.phase) for rule in COMPATIBILITY_RULES]
    assert len(rows) == len(set(rows))


@pytest.mark.parametrize("rule", COMPATIBILITY_RULES, ids=RULE_IDS)
def test_rule_turns_its_phase_off_and_records_its_name(
    rule: CompatibilityRule, caplog: pytest.LogCaptureFixture
) -> None:
    environment, trigger, base = TRIGGERS[rule.name]
    baseline = resolve(**base)
    assert baseline.for_phase(rule.phase).enabled
    with caplog.at_level(logging.INFO, logger="cudagraph.config"):
        config = resolve(environment=environment, **trigger, **base)
    phase_config = config.for_phase(rule.phase)
    assert (phase_config.backend, phase_config.buckets, phase_config.max_size) == (Backend.DISABLED, (), 0)
    source = config.sources[f"{rule.phase}.backend"]
    assert source.startswith(f"rule {rule.name}: ")
    assert any(rule.name in record.getMessage() and str(rule.phase) in record.getMessage() for record in caplog.records)
    assert all(record.name == "cudagraph.config" for record in caplog.records)


@pytest.mark.parametrize("rule", COMPATIBILITY_RULES, ids=RULE_IDS)
def test_rule_is_quiet_without_its_condition(rule: CompatibilityRule) -> None:
    _, _, base = TRIGGERS[rule.name]
    context_free = resolve(environment=Environment(), **base)
    assert context_free == resolve(**base)
    assert not any(value.startswith("rule") for value in context_free.sources.values())


@pytest.mark.parametrize("rule", COMPATIBILITY_RULES, ids=RULE_IDS)
def test_rule_never_touches_a_phase_locked_by_json(rule: CompatibilityRule, caplog: pytest.LogCaptureFixture) -> None:
    environment, trigger, base = TRIGGERS[rule.name]
    backend = resolve(**base).backend(rule.phase)
    locked_flags = {**trigger, **base, "cuda_graph_mode": {str(rule.phase): str(backend)}}
    with caplog.at_level(logging.WARNING, logger="cudagraph.config"), recorded_warnings():
        config = resolve(environment=environment, **locked_flags)
    assert config.backend(rule.phase) is backend
    assert config.sources[f"{rule.phase}.backend"] == "json --cuda-graph-mode"
    assert any("explicitly" in record.getMessage() and rule.name in record.getMessage() for record in caplog.records)


def test_rule_overruling_a_flag_logs_a_warning_but_a_default_only_info(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="cudagraph.config"):
        resolve(environment=Environment(lora=True))
        resolve(environment=Environment(lora=True), prefill_cuda_graph_backend="tc_piecewise")
    levels = [record.levelno for record in caplog.records]
    assert levels == [logging.INFO, logging.WARNING]
    assert "flag --prefill-cuda-graph-backend" in caplog.records[1].getMessage()


def test_a_rule_turning_both_phases_off_logs_one_line(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="cudagraph.config"):
        resolve(environment=Environment(device_type="cpu"))
    assert [(record.levelno, record.getMessage()) for record in caplog.records] == [
        (
            logging.INFO,
            "decode and prefill CUDA graphs off (decode was full from default, prefill was breakable from default) "
            "by rule non_cuda_device: CUDA graphs need a CUDA device, and the device type is 'cpu'",
        )
    ]


def test_rules_only_check_their_own_phase() -> None:
    config = resolve(environment=Environment(lora=True, multimodal=True, pipeline_parallel_size=4, torch_compile=True))
    assert config.decode == resolve().decode
    assert config.backend(Phase.PREFILL) is Backend.DISABLED
    assert config.sources["prefill.backend"].startswith("rule pipeline_parallel: ")  # the first row that applies


def test_mla_only_hits_breakable_and_debug_only_tc_piecewise() -> None:
    mla = Environment(mla_attention=True)
    assert resolve(environment=mla, prefill_cuda_graph_backend="tc_piecewise").prefill.enabled
    assert resolve(environment=mla).decode.backend is Backend.FULL
    assert not resolve(environment=mla).prefill.enabled
    assert resolve(debug_cuda_graph=True).prefill.backend is Backend.BREAKABLE


def test_cuda_device_with_index_counts_as_cuda() -> None:
    assert resolve(environment=Environment(device_type="cuda:1")) == resolve()


def test_rule_reason_fills_in_the_environment() -> None:
    config = resolve(environment=Environment(device_type="mps", pipeline_parallel_size=3))
    assert config.sources["decode.backend"] == (
        "rule non_cuda_device: CUDA graphs need a CUDA device, and the device type is 'mps'"
    )


def test_adding_a_rule_is_one_row(monkeypatch: pytest.MonkeyPatch) -> None:
    from cudagraph.config import rules

    extra = CompatibilityRule(
        "no_decode_on_big_pp",
        Phase.DECODE,
        "pp {pipeline_parallel_size}",
        lambda context: context.environment.pipeline_parallel_size > 4,
    )
    monkeypatch.setattr(rules, "COMPATIBILITY_RULES", (*rules.COMPATIBILITY_RULES, extra))
    config = resolve(environment=Environment(pipeline_parallel_size=8))
    assert config.sources["decode.backend"] == "rule no_decode_on_big_pp: pp 8"


def test_environment_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        Environment().lora = True  # type: ignore[misc]
