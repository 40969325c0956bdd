"""Every preset resolves to exactly the fields recorded in ``snapshots/presets.json``.

The snapshot was written from the presets as they stood before they became a table of differences, so a changed
value, a lost preset or a reordered table fails here. A value's JSON spelling is compared, so ``500000`` for
``500000.0`` (an int where a float stood) fails too.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from cudagraph.engine.model import PRESETS, ModelConfig, model_config_from_preset

SNAPSHOT: dict[str, dict[str, Any]] = json.loads((Path(__file__).parent / "snapshots" / "presets.json").read_text())


def _as_json(config: ModelConfig) -> str:
    return json.dumps(asdict(config), sort_keys=True)


def test_preset_names_and_order_match_the_snapshot() -> None:
    assert list(PRESETS) == list(SNAPSHOT)


@pytest.mark.parametrize("name", list(SNAPSHOT))
def test_preset_fields_match_the_snapshot(name: str) -> None:
    resolved = model_config_from_preset(name)
    assert isinstance(resolved, ModelConfig)
    assert _as_json(resolved) == json.dumps(SNAPSHOT[name], sort_keys=True)
