"""How the engine's custom operators (attention, the KV store, the collectives) get their implementations: one for
every device, and one for fake tensors, so that dynamo traces and compiles through them without running them.

Schemas are each op module's own (``torch.library.Library.define`` there); this module only registers the two
implementations of an op already defined and hands back its ``OpOverloadPacket``. Never imports the engine.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def implement_op(library: torch.library.Library, name: str, impl: Callable[..., Any], meta: Callable[..., Any]) -> Any:
    """Register ``impl`` for every device and ``meta`` for fake tensors under ``name`` (defined in ``library``);
    the op's ``OpOverloadPacket`` (``torch.ops.<namespace>.<name>``)."""
    library.impl(name, impl, "CompositeExplicitAutograd")
    library.impl(name, meta, "Meta")
    return getattr(getattr(torch.ops, library.ns), name)
