"""The engine's side of a model runner's life: weights updated under captured graphs, and sleep and wake.

``update_weights(model_runner, weights)`` writes new values into the model's parameters and buffers by name. In
place (the default) it copies into the same memory, so every captured graph stays valid and nothing is captured
again. With ``in_place=False`` each named tensor gets new memory (a new ``Parameter``): the graph runners then find,
from the addresses they recorded at capture, that their graphs read moved tensors, and capture them again (or, with
``on_moved="raise"``, refuse with one ``GraphInputsMovedError``): no step ever replays the old weights.

``sleep(model_runner)`` gives back the graphs (every runner's ``sleep``: graphs and pool) and the KV cache (its
storage resized to nothing; the tensors stay, so every view of them comes back with the memory); the weights stay.
``wake(model_runner)`` re-allocates the KV cache (zeroed) and wakes the runners, which capture again over the same
static buffers. A step while asleep is one ``RunnerAsleepError``. Each call reads the device's free memory
(``torch.cuda.mem_get_info``) and keeps the readings in ``model_runner.memory_levels``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from cudagraph.runner import BaseCudaGraphRunner
from cudagraph.runner.lifecycle import RunnerAsleepError, RunnerState

if TYPE_CHECKING:  # the model runner calls this module, never the other way round at import
    from .model_runner import ModelRunner

logger = logging.getLogger(__name__)


@dataclass
class MemoryLevels:
    """Free device memory (``torch.cuda.mem_get_info``) at each step of a sleep and wake; ``None`` off CUDA or
    before the step happened."""

    before_sleep: int | None = None
    asleep: int | None = None
    awake: int | None = None
    total: int | None = None

    @property
    def freed_by_sleep(self) -> int | None:
        """Bytes ``sleep`` gave back (free asleep minus free before)."""
        if self.before_sleep is None or self.asleep is None:
            return None
        return self.asleep - self.before_sleep

    @property
    def taken_by_wake(self) -> int | None:
        """Bytes ``wake`` took again (free asleep minus free awake)."""
        if self.asleep is None or self.awake is None:
            return None
        return self.asleep - self.awake


def free_device_bytes(device: torch.device) -> tuple[int, int] | None:
    """``(free, total)`` bytes of a CUDA ``device`` after a sync and a cache flush; ``None`` elsewhere."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    return int(free), int(total)


def graph_runners(model_runner: ModelRunner) -> Iterator[BaseCudaGraphRunner]:
    """The model runner's graph runners that exist (decode, verify, prefill, then the LoRA variants)."""
    for runner in (
        model_runner.decode_cuda_graph_runner,
        model_runner.verify_cuda_graph_runner,
        model_runner.prefill_cuda_graph_runner,
        model_runner.lora_decode_cuda_graph_runner,
        model_runner.lora_prefill_cuda_graph_runner,
    ):
        if runner is not None:
            yield runner


def graph_read_tensors(model_runner: ModelRunner) -> dict[str, torch.Tensor]:
    """What the model runner's graphs read beyond the runners' static buffers: the model's parameters and buffers
    (every name, tied ones included), each layer's KV pages, the request-to-token table, and the LoRA slots and
    index buffer when the engine serves adapters."""
    model: Any = model_runner.model
    tensors: dict[str, torch.Tensor] = {}
    if isinstance(model, torch.nn.Module):
        tensors.update(model.named_parameters(remove_duplicate=False))
        tensors.update(model.named_buffers(remove_duplicate=False))
    for layer, pages in enumerate(model_runner.token_to_kv_pool.kv_pages):
        tensors[f"kv_cache.{layer}"] = pages
    tensors["req_to_token"] = model_runner.req_to_token_pool.req_to_token
    if model_runner.lora is not None:
        tensors.update(model_runner.lora.named_tensors())
    return tensors


@dataclass(frozen=True)
class WeightUpdate:
    """What one ``update_weights`` did: the tensors written, whether in place, and per runner (``decode``,
    ``verify``, ``prefill``) the buckets captured again because their graphs read moved tensors."""

    names: tuple[str, ...]
    in_place: bool
    recaptured: Mapping[str, tuple[int, ...]]


def update_weights(
    model_runner: ModelRunner,
    weights: Mapping[str, torch.Tensor],
    *,
    in_place: bool = True,
    on_moved: str = "recapture",
) -> WeightUpdate:
    """Write ``weights`` (parameter or buffer name -> new value) into the model, then have every graph runner check
    its graphs' recorded addresses (see the module docstring). An unknown name, or a value of another shape, is one
    ``ValueError`` before anything is written."""
    model: Any = model_runner.model
    named: dict[str, torch.Tensor] = dict(model.named_parameters(remove_duplicate=False))
    named.update(model.named_buffers(remove_duplicate=False))
    unknown = sorted(name for name in weights if name not in named)
    if unknown:
        raise ValueError(f"update_weights: no parameter or buffer named {unknown[:5]} in the model")
    mismatched = sorted(name for name, value in weights.items() if tuple(value.shape) != tuple(named[name].shape))
    if mismatched:
        raise ValueError(
            f"update_weights: {mismatched[:5]} have other shapes than the model's (a new shape cannot replace a weight "
            "under captured graphs)"
        )
    with torch.no_grad():
        for name, value in weights.items():
            target = named[name]
            if in_place:
                target.copy_(value)
            else:
                _replace(model, name, target, value)
    model_runner.weights_version += 1
    recaptured = {_label(runner): runner.refresh_graphs(on_moved=on_moved) for runner in graph_runners(model_runner)}
    moved = {label: buckets for label, buckets in recaptured.items() if buckets}
    logger.info(
        "updated %d weights %s; %s",
        len(weights),
        "in place" if in_place else "with new memory",
        f"captured again: {moved}" if moved else "every graph still valid",
    )
    return WeightUpdate(tuple(weights), in_place, recaptured)


def _replace(model: torch.nn.Module, name: str, target: torch.Tensor, value: torch.Tensor) -> None:
    """Give the tensor ``name`` new memory holding ``value`` (a new ``Parameter`` for a parameter)."""
    module_name, _, attribute = name.rpartition(".")
    module = model.get_submodule(module_name) if module_name else model
    fresh = value.detach().to(device=target.device, dtype=target.dtype).clone()
    if isinstance(target, torch.nn.Parameter):
        setattr(module, attribute, torch.nn.Parameter(fresh, requires_grad=target.requires_grad))
    else:
        setattr(module, attribute, fresh)


def _label(runner: BaseCudaGraphRunner) -> str:
    return runner.metrics.label


def sleep(model_runner: ModelRunner) -> MemoryLevels:
    """Give back every graph and the KV cache; the weights stay (see the module docstring)."""
    if model_runner.asleep:
        raise RuntimeError("sleep() while asleep; call wake() first")
    levels = MemoryLevels()
    reading = free_device_bytes(model_runner.device)
    if reading is not None:
        levels.before_sleep, levels.total = reading
    for runner in graph_runners(model_runner):
        runner.sleep()
    for pages in model_runner.token_to_kv_pool.kv_pages:
        pages.untyped_storage().resize_(0)
    model_runner.asleep = True
    reading = free_device_bytes(model_runner.device)
    if reading is not None:
        levels.asleep = reading[0]
    model_runner.memory_levels = levels
    logger.info("asleep: graphs and KV cache given back (%s bytes freed)", levels.freed_by_sleep)
    return levels


def wake(model_runner: ModelRunner) -> MemoryLevels:
    """Re-allocate the KV cache and capture the graphs again (see the module docstring); a runner that cannot
    capture runs eagerly and says why (its ``eager_reason``)."""
    if not model_runner.asleep:
        raise RuntimeError("wake() while awake; call sleep() first")
    levels = model_runner.memory_levels
    for pages in model_runner.token_to_kv_pool.kv_pages:
        pages.untyped_storage().resize_(pages.numel() * pages.element_size())
        pages.zero_()
    model_runner.asleep = False
    for runner in graph_runners(model_runner):
        if runner.wake() is RunnerState.FAILED:
            logger.warning("%s graphs did not come back: %s", _label(runner), runner.eager_reason)
    reading = free_device_bytes(model_runner.device)
    if reading is not None:
        levels.awake = reading[0]
    return levels


def refuse_while_asleep(model_runner: ModelRunner) -> None:
    """One ``RunnerAsleepError`` for a step of a model runner that is asleep."""
    if model_runner.asleep:
        raise RunnerAsleepError("a step reached a model runner that is asleep (KV cache given back): call wake() first")
