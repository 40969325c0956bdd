"""Legacy backend value spellings ("tcpcg", "tcpiecewise"): accepted wherever a backend is, one warning each."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from config_helpers import recorded_warnings, resolve_argv

from cudagraph.config import LEGACY_BACKEND_VALUES, Backend, ConfigError, LegacyFlagWarning, resolve

tomllib = pytest.importorskip(
    "tomllib" if sys.version_info >= (3, 11) else "tomli",
    reason="reading refactor/renames.toml on Python 3.10 needs tomli: pip install tomli (cudagraph-config requires it)",
)

ROOT = Path(__file__).resolve().parents[2]
SPELLINGS = sorted(LEGACY_BACKEND_VALUES)

# (command line, keywords, the canonical command line, the settings key the spelling decides)
PLACES = [
    (
        ["--decode-cuda-graph-backend", "{}"],
        {"decode_cuda_graph_backend": "{}"},
        ["--decode-cuda-graph-backend", "tc_piecewise"],
        "decode.backend",
    ),
    (
        ["--prefill-cuda-graph-backend", "{}"],
        {"prefill_cuda_graph_backend": "{}"},
        ["--prefill-cuda-graph-backend", "tc_piecewise"],
        "prefill.backend",
    ),
    (
        ["--cuda-graph-mode", '{{"prefill": "{}"}}'],
        {"cuda_graph_mode": {"prefill": "{}"}},
        ["--cuda-graph-mode", '{"prefill": "tc_piecewise"}'],
        "prefill.backend",
    ),
]


def _spell(template: object, spelling: str) -> object:
    if isinstance(template, str):
        return template.format(spelling)
    if isinstance(template, dict):
        return {key: _spell(value, spelling) for key, value in template.items()}
    assert isinstance(template, list)
    return [_spell(item, spelling) for item in template]


def test_the_table_is_the_config_string_rows_of_renames_toml() -> None:
    rows = tomllib.loads((ROOT / "refactor" / "renames.toml").read_text())["rename"]
    config_strings = [row for row in rows if row["kind"] == "config_string"]
    assert {row["old"]: Backend(row["new"]) for row in config_strings} == dict(LEGACY_BACKEND_VALUES)
    assert {(row["deprecated_in"], row["removed_in"]) for row in config_strings} == {("0.1.0", "1.0.0")}
    assert set(SPELLINGS) >= {"tcpcg", "tcpiecewise"}


@pytest.mark.parametrize("spelling", SPELLINGS)
@pytest.mark.parametrize(("argv", "keywords", "canonical", "key"), PLACES, ids=lambda value: str(value)[:40])
def test_legacy_spelling_resolves_like_tc_piecewise_and_warns_once(
    spelling: str, argv: list[str], keywords: dict[str, object], canonical: list[str], key: str
) -> None:
    expected = resolve_argv(canonical)
    option = canonical[0]
    with recorded_warnings() as from_flags:
        config_from_flags = resolve_argv(_spell(argv, spelling))
    with recorded_warnings() as from_keywords:
        config_from_keywords = resolve(**_spell(keywords, spelling))
    assert from_keywords[0].filename == __file__  # points at the caller of resolve
    for config, caught in ((config_from_flags, from_flags), (config_from_keywords, from_keywords)):
        assert config == expected
        assert [(w.category, str(w.message)) for w in caught] == [
            (
                LegacyFlagWarning,
                f"backend value {spelling!r} (in {option}) is deprecated since cudagraph-config 0.1.0 and will be "
                "removed in 1.0.0; use 'tc_piecewise' instead",
            )
        ]
        assert config.sources[key] == f"{expected.sources[key]} (legacy value {spelling!r})"


def test_explain_shows_the_legacy_spelling() -> None:
    with recorded_warnings():
        config = resolve_argv(["--decode-cuda-graph-backend", "tcpcg"])
    line = next(line for line in config.explain().splitlines() if line.startswith("decode.backend"))
    assert line.split() == [
        "decode.backend",
        "tc_piecewise",
        "flag",
        "--decode-cuda-graph-backend",
        "(legacy",
        "value",
        "'tcpcg')",
    ]


def test_one_warning_per_spelling_naming_every_flag_that_used_it() -> None:
    with recorded_warnings() as caught:
        config = resolve_argv(
            [
                *("--cuda-graph-mode", '{"decode": "tcpcg", "prefill": "tcpcg"}'),
                *("--prefill-cuda-graph-backend", "tcpcg"),
                *("--decode-cuda-graph-backend", "tcpiecewise"),
            ]
        )
    assert config.decode.backend is config.prefill.backend is Backend.TC_PIECEWISE
    messages = [str(w.message) for w in caught]
    assert all(w.category is LegacyFlagWarning for w in caught)
    assert len(messages) == 2
    assert messages[0].startswith("backend value 'tcpcg' (in --cuda-graph-mode, --prefill-cuda-graph-backend) is")
    assert messages[1].startswith("backend value 'tcpiecewise' (in --decode-cuda-graph-backend) is")


def test_legacy_and_canonical_spellings_agree_without_a_conflict() -> None:
    with recorded_warnings() as caught:
        config = resolve_argv(
            ["--decode-cuda-graph-backend", "tcpcg", "--cuda-graph-mode", '{"decode": "tc_piecewise"}']
        )
    assert config.decode.backend is Backend.TC_PIECEWISE
    assert [w.category for w in caught] == [LegacyFlagWarning]  # no OverriddenSettingWarning: the values are equal


def test_a_failed_resolution_warns_about_nothing() -> None:
    with recorded_warnings() as caught, pytest.raises(ConfigError, match="both have the same precedence"):
        resolve_argv(["--decode-cuda-graph-backend", "tcpcg", "--decode-disable-cuda-graph"])
    assert caught == []


@pytest.mark.parametrize("spelling", ["TCPCG", "tc-piecewise", "tcpcg "])
def test_near_misses_are_unknown_backends(spelling: str) -> None:
    with pytest.raises(ConfigError) as error:
        resolve(decode_cuda_graph_backend=spelling)
    assert str(error.value) == (
        f"--decode-cuda-graph-backend: unknown backend {spelling!r} for decode; "
        "allowed backends: full, breakable, tc_piecewise, disabled"
    )
