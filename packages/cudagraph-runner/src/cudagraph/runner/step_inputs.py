"""A step's route, decided once before its batch is built, and where to write its inputs.

An engine asks a runner for ``step_inputs`` of the step it is about to build: the runner routes it (one lookup in its
route table) and, when it will replay, gives the static buffers' views to write the step into. The engine builds the
batch on those views with ``ForwardBatch.route`` set to that route, and the runner's ``replay`` takes the route as
given: a step is looked up once, not once to build it and again to run it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import torch

from .routing import Route


class StepInputs(NamedTuple):
    """What a runner says of a step of a given size before it is built.

    A named tuple: one is made per step, so it is as cheap to build as a tuple.
    """

    route: Route
    """The step's route (a bucket, or why it runs eagerly): carried on its batch as ``ForwardBatch.route``."""
    views: Mapping[str, torch.Tensor] | None
    """Where to write the step so that its replay copies nothing (``input_views``); ``None`` when it runs eagerly
    or has no rows."""
