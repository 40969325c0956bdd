"""Config resolution through the engine's server-argument helpers."""

import pytest

from toy_engine import server_args
from toy_engine.server_args import (
    BREAKABLE_PREFILL_ARGV,
    DECODE_ONLY_ARGV,
    NO_GRAPHS_ARGV,
    TC_PIECEWISE_PREFILL_ARGV,
    Backend,
)


def test_decode_only_keywords_and_flags_agree():
    from_keywords = server_args.decode_only_config()
    from_flags = server_args.config_from_argv(DECODE_ONLY_ARGV)
    for config in (from_keywords, from_flags):
        assert config.decode.backend is Backend.FULL
        assert config.decode.buckets == (1, 2, 4)
        assert config.decode.max_size == 4
        assert config.prefill.backend is Backend.DISABLED


def test_no_graphs_turns_both_phases_off():
    for config in (server_args.no_graphs_config(), server_args.config_from_argv(NO_GRAPHS_ARGV)):
        assert config.decode.backend is Backend.DISABLED
        assert config.prefill.backend is Backend.DISABLED


def test_breakable_prefill():
    for config in (server_args.breakable_prefill_config(), server_args.config_from_argv(BREAKABLE_PREFILL_ARGV)):
        assert config.prefill.backend is Backend.BREAKABLE
        assert config.prefill.buckets == (16, 32, 64)
        assert config.prefill.max_size == 64


def test_tc_piecewise_prefill():
    for config in (server_args.tc_piecewise_prefill_config(), server_args.config_from_argv(TC_PIECEWISE_PREFILL_ARGV)):
        assert config.prefill.backend is Backend.TCPIECEWISE
        assert config.tc_piecewise_compiler == "eager"


def test_backend_spellings():
    assert server_args.prefill_backend_named("tcpcg") is Backend.TCPIECEWISE
    assert server_args.prefill_backend_named("tcpiecewise") is Backend.TCPIECEWISE
    assert server_args.prefill_backend_named("breakable") is Backend.BREAKABLE


def test_default_decode_buckets_ascend_within_the_limit():
    buckets = server_args.decode_default_buckets(8)
    assert buckets and list(buckets) == sorted(set(buckets)) and max(buckets) <= 8


def test_bad_backend_is_a_config_error():
    with pytest.raises(Exception) as raised:
        server_args.config_from_argv(["--prefill-cuda-graph-backend", "fastest"])
    assert server_args.is_config_error(raised.value) or isinstance(raised.value, SystemExit)
