"""The engine's side of a model runner's life: weights updated under captured graphs, and sleep and wake.

``update_weights(model_runner, weights)`` writes new values into the model's parameters and buffers by name. In
place (the default) it copies into the same memory, so every captured graph stays valid and nothing is captured
again. With ``in_place=False`` each named tensor gets new memory (a new ``Parameter``): the graph runners then find,
from the addresses they recorded at capture, that their graphs read moved tensors, and capture them again (or, with
``on_moved="raise"``, refuse with one ``GraphInputsMovedError``): no step ever replays the old weights.

``sleep(model_runner, level)`` gives back the graphs' and the KV cache's memory, and the weights' at ``level`` 1
(copied to pinned host memory first, copied back at wake) or 2 (discarded: the caller loads new weights after the
wake, as RL drivers do between rollouts); level 0 keeps the weights on the device. ``wake(model_runner)`` brings the
memory back, the KV cache empty. A step while asleep is one ``RunnerAsleepError``. Each call reads the device's free
memory (``torch.cuda.mem_get_info``) and keeps the readings in ``model_runner.memory_levels``.

Where the engine was built with ``enable_sleep_mode`` and sleepable memory exists here
(``cudagraph.backend_utils.sleep_memory``), the weights, the KV cache and the graph pool were allocated from it: a
sleep unmaps their pages and a wake maps new pages at the same virtual addresses, so every runner keeps its graphs
(``sleep(keep_graphs=True)``) and the first step after the wake replays with nothing captured again. Elsewhere (no
CUDA, no ``torch-memory-saver``, sleep mode off) the KV cache's storage is resized to nothing and back, the weights'
likewise at levels 1 and 2, and the runners free their graphs and capture them again at wake; with sleep mode asked
for, one line says why (``model_runner.sleep_memory_reason``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from cudagraph.backend_utils import get_global_graph_memory_pool, set_global_graph_memory_pool
from cudagraph.backend_utils.sleep_memory import MemoryTag, SleepMemory, sleep_memory_unavailable_reason
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


SLEEP_LEVELS: Mapping[int, str] = {
    0: "the weights stay on the device",
    1: "the weights are copied to host memory and back",
    2: "the weights are discarded; load new ones after the wake",
}
"""What each ``sleep`` level does with the weights (vLLM's levels; 0 is the lightest); every level gives back the
graphs' and the KV cache's memory."""


def open_sleep_memory(device: torch.device) -> tuple[SleepMemory | None, str | None]:
    """Sleepable memory for an engine built with ``enable_sleep_mode``, the process's graph pool made from it (the
    engine moves its weights in with ``flatten_weights``). Returns the memory and ``None``, or ``None`` and the
    one-line reason there is none here (the engine then recaptures at wake)."""
    reason = sleep_memory_unavailable_reason(device)
    if reason is not None:
        logger.info("sleep mode: graphs will be captured again at every wake: %s", reason)
        return None, reason
    memory = SleepMemory.create(device)
    set_global_graph_memory_pool(memory.graph_pool())
    logger.info("sleep mode: weights, KV cache and graphs in sleepable memory; a wake replays with no recapture")
    return memory, None


WEIGHT_ALIGNMENT = 256
"""Bytes each parameter's place in the flat weight buffer is aligned to (what cuBLAS and Triton's loads like)."""


def flatten_weights(memory: SleepMemory | None, model: Any) -> torch.Tensor | None:
    """Move the model's parameters into one flat buffer of sleepable weight memory (same values, new addresses,
    before any graph reads them; each parameter a view of its aligned place) and return the buffer: a level-1 sleep
    then copies it out and back in one transfer each way. ``None`` without sleepable memory or parameters."""
    parameters = _unique_parameters(model)
    if memory is None or not parameters:
        return None
    offsets, total = [], 0
    for parameter in parameters:
        offsets.append(total)
        nbytes = parameter.numel() * parameter.element_size()
        total += -(-nbytes // WEIGHT_ALIGNMENT) * WEIGHT_ALIGNMENT
    with memory.allocating(MemoryTag.WEIGHTS), torch.no_grad():
        buffer = torch.empty(total, dtype=torch.uint8, device=parameters[0].device)
        for parameter, offset in zip(parameters, offsets, strict=True):
            nbytes = parameter.numel() * parameter.element_size()
            place = buffer[offset : offset + nbytes].view(parameter.dtype).view(parameter.shape)
            place.copy_(parameter.data)
            parameter.data = place
    return buffer


def close_sleep_memory(memory: SleepMemory | None) -> None:
    """At an engine's shutdown: later captures of the process stop going to its sleepable graph pool, whose pages are
    unmapped (its addresses stay reserved for the process's life; see ``cudagraph.backend_utils.sleep_memory``)."""
    if memory is None:
        return
    if get_global_graph_memory_pool() == memory.graph_pool().handle:
        set_global_graph_memory_pool(None)
    memory.close()


def allocating(memory: SleepMemory | None, tag: MemoryTag) -> contextlib.AbstractContextManager[None]:
    """``memory.allocating(tag)``, or nothing to do without sleepable memory."""
    return memory.allocating(tag) if memory is not None else contextlib.nullcontext()


def _unique_parameters(model: Any) -> list[torch.nn.Parameter]:
    """The model's parameters, each once (a tied parameter appears under several names)."""
    if not isinstance(model, torch.nn.Module):
        return []
    return list({id(parameter): parameter for parameter in model.parameters()}.values())


def _weight_blocks(model_runner: ModelRunner) -> list[torch.Tensor]:
    """What a level-1 sleep copies out and back: the flat weight buffer (sleep mode), else every parameter."""
    if model_runner.weights_buffer is not None:
        return [model_runner.weights_buffer]
    return [parameter.data for parameter in _unique_parameters(model_runner.model)]


def _backup_weights(model_runner: ModelRunner) -> None:
    """Copy the weights into pinned host memory (reused from the last level-1 sleep when the shapes match)."""
    backup = model_runner.weights_on_host
    blocks = _weight_blocks(model_runner)
    if len(backup) != len(blocks) or any(
        host.shape != block.shape or host.dtype != block.dtype for host, block in zip(backup, blocks, strict=True)
    ):
        pinned = torch.cuda.is_available()
        backup[:] = [torch.empty_like(block, device="cpu", pin_memory=pinned) for block in blocks]
    for host, block in zip(backup, blocks, strict=True):
        host.copy_(block, non_blocking=True)
    if model_runner.device.type == "cuda":
        torch.cuda.synchronize(model_runner.device)


def _restore_weights(model_runner: ModelRunner) -> None:
    """Copy the level-1 backup back into the weights (the memory they had, or memory allocated again)."""
    for host, block in zip(model_runner.weights_on_host, _weight_blocks(model_runner), strict=True):
        block.copy_(host, non_blocking=True)


def _zero_kv_cache(model_runner: ModelRunner) -> None:
    """Zero the KV cache. Pages mapped back by sleepable memory are zeroed on a side stream, beside the weights' copy
    the current stream may be running (nothing else can touch fresh pages), then the streams join; elsewhere on the
    current stream (storage allocated again may hold blocks the current stream's pending work last used)."""
    pages = model_runner.token_to_kv_pool.kv_pages
    if model_runner.sleep_memory is None or model_runner.device.type != "cuda":
        for page in pages:
            page.zero_()
        return
    current = torch.cuda.current_stream(model_runner.device)
    side = torch.cuda.Stream(model_runner.device)
    with torch.cuda.stream(side):
        for page in pages:
            page.zero_()
    current.wait_stream(side)


def _resize_storages(tensors: Sequence[torch.Tensor], *, to_nothing: bool) -> None:
    """Without sleepable memory: give each tensor's storage back (``to_nothing``) or allocate it again (new
    addresses; the graphs that read it were released and are captured again)."""
    for tensor in tensors:
        storage = tensor.untyped_storage()
        storage.resize_(0 if to_nothing else tensor.numel() * tensor.element_size())


def sleep(model_runner: ModelRunner, level: int = 0) -> MemoryLevels:
    """Give back the graphs, the KV cache and, at level 1 or 2, the weights (see the module docstring)."""
    if level not in SLEEP_LEVELS:
        raise ValueError(f"sleep level {level!r}: allowed: " + "; ".join(f"{k} ({v})" for k, v in SLEEP_LEVELS.items()))
    if model_runner.asleep:
        raise RuntimeError("sleep() while asleep; call wake() first")
    levels = MemoryLevels()
    reading = free_device_bytes(model_runner.device)
    if reading is not None:
        levels.before_sleep, levels.total = reading
    memory = model_runner.sleep_memory
    kept = [runner.sleep(keep_graphs=memory is not None) for runner in graph_runners(model_runner)]
    if level == 1:
        _backup_weights(model_runner)
    if memory is not None:
        memory.release({MemoryTag.GRAPHS, MemoryTag.KV_CACHE, *((MemoryTag.WEIGHTS,) if level else ())})
    else:
        _resize_storages(model_runner.token_to_kv_pool.kv_pages, to_nothing=True)
        if level:
            _resize_storages(_unique_parameters(model_runner.model), to_nothing=True)
    model_runner.asleep = True
    model_runner.sleep_level = level
    reading = free_device_bytes(model_runner.device)
    if reading is not None:
        levels.asleep = reading[0]
    model_runner.memory_levels = levels
    logger.info(
        "asleep (level %d: %s): graphs %s, KV cache given back (%s bytes freed)",
        level,
        SLEEP_LEVELS[level],
        "kept" if kept and all(kept) else "released",
        levels.freed_by_sleep,
    )
    return levels


def wake(model_runner: ModelRunner) -> MemoryLevels:
    """Bring back the memory ``sleep`` gave back, the KV cache zeroed and the weights as its level left them, then
    wake the runners: kept graphs replay as they are, released ones are captured again (see the module docstring);
    a runner that cannot capture runs eagerly and says why (its ``eager_reason``)."""
    if not model_runner.asleep:
        raise RuntimeError("wake() while awake; call sleep() first")
    levels = model_runner.memory_levels
    level = model_runner.sleep_level
    memory = model_runner.sleep_memory
    if memory is not None:
        if level == 1:  # the weights first: their copy runs while the rest is mapped back and zeroed
            memory.restore({MemoryTag.WEIGHTS})
            _restore_weights(model_runner)
        memory.restore(set(MemoryTag))
    else:
        _resize_storages(model_runner.token_to_kv_pool.kv_pages, to_nothing=False)
        if level:
            _resize_storages(_unique_parameters(model_runner.model), to_nothing=False)
        if level == 1:
            _restore_weights(model_runner)
    model_runner.asleep = False
    for runner in graph_runners(model_runner):
        if runner.wake() is RunnerState.FAILED:
            logger.warning("%s graphs did not come back: %s", _label(runner), runner.eager_reason)
    # Zeroed after the runners woke: a capture again (memory that did not outlive the sleep) runs its warm-ups and
    # captures on whatever the weights hold (at level 2, garbage until the caller loads new ones), writing the scratch
    # slot padded rows use; a NaN left there would reach real rows through the masked columns of their attention.
    _zero_kv_cache(model_runner)
    reading = free_device_bytes(model_runner.device)
    if reading is not None:
        levels.awake = reading[0]
    return levels


def refuse_while_asleep(model_runner: ModelRunner) -> None:
    """One ``RunnerAsleepError`` for a step of a model runner that is asleep."""
    if model_runner.asleep:
        raise RunnerAsleepError("a step reached a model runner that is asleep (KV cache given back): call wake() first")
