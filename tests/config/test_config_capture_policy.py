"""The capture policy: when a phase's graphs are captured (``eager``: at start-up; ``lazy``: on first use)."""

from __future__ import annotations

import pytest
from config_helpers import parse

from cudagraph.config import CAPTURE_POLICY_OPTIONS, CapturePolicy, ConfigError, Phase, resolve


def test_default_is_eager_for_both_phases() -> None:
    config = resolve()
    assert config.decode.capture_policy is CapturePolicy.EAGER
    assert config.prefill.capture_policy is CapturePolicy.EAGER
    assert config.sources["decode.capture_policy"] == "default"


@pytest.mark.parametrize("phase", list(Phase))
def test_per_phase_flag_sets_its_phase_only(phase: Phase) -> None:
    config = resolve(parse([CAPTURE_POLICY_OPTIONS[phase], "lazy"]))
    other = Phase.PREFILL if phase is Phase.DECODE else Phase.DECODE
    assert config.for_phase(phase).capture_policy is CapturePolicy.LAZY
    assert config.for_phase(other).capture_policy is CapturePolicy.EAGER
    assert config.sources[f"{phase}.capture_policy"] == f"flag {CAPTURE_POLICY_OPTIONS[phase]}"


def test_json_key_outranks_the_flag() -> None:
    with pytest.warns(UserWarning, match="capture_policy"):
        config = resolve(
            cuda_graph_mode='{"decode": {"backend": "full", "capture_policy": "eager"}}',
            decode_cuda_graph_capture_policy="lazy",
        )
    assert config.decode.capture_policy is CapturePolicy.EAGER


def test_unknown_policy_is_one_error_naming_the_flag_and_the_choices() -> None:
    with pytest.raises(ConfigError) as raised:
        resolve(parse(["--prefill-cuda-graph-capture-policy", "on_demand"]))
    assert str(raised.value) == (
        "--prefill-cuda-graph-capture-policy: unknown capture policy 'on_demand'; allowed: eager, lazy"
    )


def test_a_disabled_phase_keeps_eager_and_says_why() -> None:
    config = resolve(decode_disable_cuda_graph=True, decode_cuda_graph_capture_policy="lazy")
    assert config.decode.capture_policy is CapturePolicy.EAGER
    assert config.sources["decode.capture_policy"] == "derived from decode.backend disabled"


def test_explain_and_cli_args_carry_a_lazy_policy() -> None:
    config = resolve(decode_cuda_graph_capture_policy="lazy")
    lines = {line.split()[0]: line for line in config.explain().splitlines()}
    assert "lazy" in lines["decode.capture_policy"]
    assert "first step routed to it" in lines["decode.captured"]
    assert "at start-up" in lines["prefill.captured"]
    args = config.to_cli_args()
    assert args[args.index("--decode-cuda-graph-capture-policy") + 1] == "lazy"
    assert "--prefill-cuda-graph-capture-policy" not in args
    assert resolve(parse(args)) == config
    assert config.to_dict()["decode_capture_policy"] == "lazy"
