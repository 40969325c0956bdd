"""Published Hugging Face ``config.json`` files (trimmed to the fields a model config reads, in Transformers 4
spelling), stored as the JSON they are under ``published_configs/``, for the model-config tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

PUBLISHED_CONFIGS = Path(__file__).parent / "published_configs"


def published_config(name: str) -> dict[str, Any]:
    """The stored ``config.json`` of ``name`` (a file stem under ``published_configs/``), a fresh dict each call."""
    loaded: dict[str, Any] = json.loads((PUBLISHED_CONFIGS / f"{name}.json").read_text())
    return loaded
