"""Fixtures for the runner tests: a tiny real engine on the CPU and a backend that "replays" by re-running.

``RerunBackend`` stands in for a CUDA-graph backend on a machine without CUDA. Capturing a shape records the
forward (a closure over the runner's static buffers); replaying runs that forward again, in capture mode, on
whatever the runner copied into those buffers. So every runner step is checked for what a graph would see: the
static buffers and the graph-path attention metadata, never the caller's batch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pytest
import torch

from cudagraph.backend_utils import is_capture_mode, model_capture_mode
from cudagraph.config import Backend, CudaGraphConfig, PhaseConfig
from cudagraph.engine.batch import Request, SamplingParams, make_extend_batch
from cudagraph.engine.model import model_config_from_preset, random_model
from cudagraph.engine.model_runner import CacheConfig, ModelRunner


class RerunBackend:
    """A CPU stand-in for a graph backend: capture records ``forward_fn``, replay re-runs it in capture mode."""

    def __init__(self, captures_attn_metadata: bool = True) -> None:
        self.captures_attn_metadata = captures_attn_metadata
        self.forward_fns: dict[int, Callable[[], torch.Tensor]] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.captured_order: list[int] = []
        self.replayed: list[int] = []
        self.prepared = 0
        self.cleaned = 0
        self.in_session = False

    def prepare(self, runner: object) -> None:
        self.prepared += 1

    @contextlib.contextmanager
    def capture_session(self, stream: object = None) -> Iterator[None]:
        self.in_session = True
        with model_capture_mode():
            yield
        self.in_session = False

    def capture_one(self, shape: int, forward_fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        assert self.in_session and is_capture_mode()
        output = forward_fn()
        self.forward_fns[shape] = forward_fn
        self.outputs[shape] = output
        self.captured_order.append(shape)
        return output

    def has_shape(self, shape: int) -> bool:
        return shape in self.forward_fns

    def replay(self, shape: int, **kwargs: object) -> torch.Tensor:
        with model_capture_mode():
            output = self.forward_fns[shape]()
        # A graph writes into the same static output every replay.
        self.outputs[shape].copy_(output)
        self.replayed.append(shape)
        return self.outputs[shape]

    @contextlib.contextmanager
    def runtime_session(self) -> Iterator[None]:
        yield

    def cleanup(self) -> None:
        self.forward_fns.clear()
        self.outputs.clear()
        self.cleaned += 1


def graph_config(
    decode: tuple[int, ...] = (1, 2, 4, 8),
    prefill: tuple[int, ...] = (16, 32, 64),
    *,
    disable_padding: bool = False,
) -> CudaGraphConfig:
    """Decode full and prefill breakable at the given buckets."""
    return CudaGraphConfig(
        decode=PhaseConfig(Backend.FULL, decode, max(decode)),
        prefill=PhaseConfig(Backend.BREAKABLE, prefill, max(prefill)),
        disable_padding=disable_padding,
    )


def make_model_runner(
    preset: str = "tiny-qwen3-random", config: CudaGraphConfig | None = None, max_num_reqs: int = 16
) -> ModelRunner:
    """A CPU engine with random weights and a small KV cache."""
    model = random_model(model_config_from_preset(preset), seed=0, dtype="float32", device="cpu")
    return ModelRunner(model, config or graph_config(), cache_config=CacheConfig(max_num_reqs, max_context_len=64))


@pytest.fixture
def model_runner() -> ModelRunner:
    return make_model_runner()


def admit(model_runner: ModelRunner, prompts: list[list[int]], max_new_tokens: int = 8) -> list[Request]:
    """Requests for ``prompts`` holding a request row and KV slots, nothing cached yet."""
    requests = []
    for index, prompt in enumerate(prompts):
        request = Request(index, list(prompt), SamplingParams(max_new_tokens=max_new_tokens))
        request.req_pool_index = model_runner.req_to_token_pool.alloc()
        request.kv_slots = model_runner.token_to_kv_pool.alloc(request.budget)
        model_runner.req_to_token_pool.write(request.req_pool_index, 0, request.kv_slots)
        requests.append(request)
    return requests


def prefill_eagerly(model_runner: ModelRunner, requests: list[Request]) -> None:
    """Cache every request's uncached tokens with an eager extend step and append its greedy next token."""
    logits = model_runner.forward(make_extend_batch(requests, model_runner.device))
    for request, token in zip(requests, logits.argmax(-1).tolist(), strict=True):
        request.cached_len = len(request.token_ids)
        request.output_ids.append(token)


def prompts_of(lengths: list[int], seed: int = 0, vocab: int = 512) -> list[list[int]]:
    """Random prompts of the given lengths."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (length,), generator=generator).tolist() for length in lengths]
