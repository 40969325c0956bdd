"""``--rewrite-config``: legacy option keys of YAML, TOML and JSON files renamed in place.

Only keys are rewritten, and only those whose option became one other option with the same value
(``cuda_graph_max_bs: 64`` -> ``decode_cuda_graph_max_bs: 64``); an option that became several
(``disable_cuda_graph``) or a valued one (``enforce_piecewise_cuda_graph``) stays listed. The key is replaced where
it stands, so comments, order, quoting and layout stay exactly as they were; the file's own library then reads the
text before and after and the rewrite is kept only if the data is the same with the keys renamed (``ruamel.yaml``
and ``tomlkit``, the ``cudagraph-migrate[config]`` extra, read YAML and TOML; JSON needs nothing). Without the extra,
YAML and TOML keys stay listed, and the run says once which extra to install.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .inventory import AccountedItem, FileKind, Outcome
from .spellings import SpellingForm
from .text_scan import line_starts

__all__ = ["CONFIG_EXTRA_HINT", "ConfigRewrite", "config_libraries_installed", "rewrite_config_keys"]

CONFIG_EXTRA_HINT = (
    "--rewrite-config: YAML and TOML keys are rewritten with ruamel.yaml and tomlkit, which are not installed: "
    "pip install 'cudagraph-migrate[config]' (JSON keys were rewritten; YAML and TOML ones are listed)"
)
"""The one line a run prints where YAML or TOML keys could not be rewritten for want of the extra."""


def config_libraries_installed() -> bool:
    """Whether the ``config`` extra (``ruamel.yaml``, ``tomlkit``) is importable."""
    return all(importlib.util.find_spec(name) is not None for name in ("ruamel", "tomlkit"))


@dataclass
class ConfigRewrite:
    """The result of rewriting one config file's keys."""

    text: str
    items: list[AccountedItem]
    missing_extra: bool = False
    """YAML/TOML keys stayed because the ``config`` extra is not installed."""


def _one_target(accounted: AccountedItem) -> str | None:
    """The new key of a listed key item whose option became exactly one option with the same value."""
    spelling = accounted.item.spelling
    if accounted.item.context != "key" or spelling.form not in (SpellingForm.OPTION, SpellingForm.OPTION_DASHED):
        return None
    row = spelling.row
    if row.also or row.value is not None:
        return None
    return row.new if spelling.form == SpellingForm.OPTION else row.new.replace("_", "-")


def rewrite_config_keys(text: str, kind: FileKind, items: Sequence[AccountedItem]) -> ConfigRewrite:
    """``text`` with each key item of ``items`` that one option replaces renamed in place, and the items with their
    outcomes (a rewritten one is ``REWRITTEN``; one that stays keeps its listing, saying why)."""
    loader = _loader(kind)
    if loader is None:
        return ConfigRewrite(text, list(items), missing_extra=kind in (FileKind.YAML, FileKind.TOML))
    starts = line_starts(text)
    edits: list[tuple[int, str, str]] = []
    for accounted in items:
        new = _one_target(accounted)
        if new is not None:
            offset = starts[accounted.item.line - 1] + accounted.item.column - 1
            edits.append((offset, accounted.item.spelling.text, new))
    if not edits:
        return ConfigRewrite(text, list(items))
    rewritten = text
    for offset, old, new in sorted(edits, reverse=True):
        rewritten = rewritten[:offset] + new + rewritten[offset + len(old) :]
    renames = {old: new for _, old, new in edits}
    try:
        same = _renamed(loader(text), renames) == _plain(loader(rewritten))
    except Exception:  # the file's library cannot read it: nothing is rewritten
        same = False
    if not same:
        why = "a legacy option key left as written: renaming it in place would not give the same data"
        return ConfigRewrite(
            text, [_relisted(accounted, why) if _one_target(accounted) else accounted for accounted in items]
        )
    done = {(offset) for offset, _, _ in edits}
    result = []
    for accounted in items:
        offset = starts[accounted.item.line - 1] + accounted.item.column - 1
        if offset in done and _one_target(accounted):
            result.append(AccountedItem(accounted.item, Outcome.REWRITTEN))
        else:
            result.append(accounted)
    return ConfigRewrite(rewritten, result)


def _relisted(accounted: AccountedItem, why: str) -> AccountedItem:
    return AccountedItem(accounted.item, Outcome.LISTED, why)


def _loader(kind: FileKind) -> Callable[[str], Any] | None:
    if kind is FileKind.JSON:
        return json.loads
    if not config_libraries_installed():
        return None
    if kind is FileKind.YAML:
        from ruamel.yaml import YAML

        def load_yaml(text: str) -> Any:
            return list(YAML(typ="safe", pure=True).load_all(text))

        return load_yaml
    if kind is FileKind.TOML:
        import tomlkit

        return lambda text: tomlkit.parse(text).unwrap()
    return None


def _plain(data: Any) -> Any:
    if isinstance(data, Mapping):
        return {str(key): _plain(value) for key, value in data.items()}
    if isinstance(data, list | tuple):
        return [_plain(value) for value in data]
    return data


def _renamed(data: Any, renames: Mapping[str, str]) -> Any:
    """``data`` with every mapping key of ``renames`` renamed (what the in-place rewrite must give)."""
    if isinstance(data, Mapping):
        return {renames.get(str(key), str(key)): _renamed(value, renames) for key, value in data.items()}
    if isinstance(data, list | tuple):
        return [_renamed(value, renames) for value in data]
    return data
