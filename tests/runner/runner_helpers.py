"""Helpers for the runner tests (imported by name; ``conftest`` only holds the fixtures): a tiny real engine on the
CPU, replayed through ``CpuReplayBackend``.

The test double stands in for the full and breakable backends on a machine without CUDA (see
``cudagraph.backend.testing``): every runner step is checked for what a graph would see, the static buffers and the
graph-path attention metadata, never the caller's batch; breakable replays run recorded segments and the eager
attention breaks in order. ``StubModelRunner`` is a model of one lookup, for tests that capture a runner per example.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from stubs import StubAttention

from cudagraph.backend.testing import CpuReplayBackend
from cudagraph.config import Backend, CudaGraphConfig, PhaseConfig
from cudagraph.engine.batch import Request, SamplingParams, make_decode_batch, make_extend_batch
from cudagraph.engine.model import model_config_from_preset, random_model
from cudagraph.engine.model_runner import CacheConfig, ModelRunner
from cudagraph.runner import DecodeCudaGraphRunner, ForwardBatch, ForwardMode


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


def admit(model_runner: ModelRunner, prompts: list[list[int]], max_new_tokens: int = 8) -> list[Request]:
    """Requests for ``prompts`` holding a request row and KV slots, nothing cached yet."""
    requests = []
    for index, prompt in enumerate(prompts):
        request = Request(index, list(prompt), SamplingParams(max_new_tokens=max_new_tokens))
        requests.append(model_runner.hold(request))
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


class StubModelRunner:
    """A ``ModelRunnerLike`` whose forward is one lookup: row ``i`` of the logits is ``table[input_ids[i]]`` plus
    ``positions[i]``. Capturing it takes milliseconds, so property tests can capture a runner per example."""

    device = torch.device("cpu")
    dtype = torch.float32

    def __init__(self, vocab: int = 32, width: int = 4, request_rows: int = 64) -> None:
        self.table = torch.randn(vocab, width, generator=torch.Generator().manual_seed(0))
        self.vocab = vocab
        self.attn_backend = StubAttention()
        self.req_to_token_pool = SimpleNamespace(req_to_token=torch.zeros(request_rows, 8, dtype=torch.int32))
        self.forward_calls = 0

    def forward(self, batch: ForwardBatch) -> torch.Tensor:
        self.forward_calls += 1
        return self.table.index_select(0, batch.input_ids) + batch.positions[:, None].float()


def stub_decode_batch(size: int, seed: int = 0, mode: ForwardMode = ForwardMode.DECODE) -> ForwardBatch:
    """A decode (or idle, with size 0) batch of ``size`` requests of random tokens for ``StubModelRunner``."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 32, (size,), generator=generator)
    positions = torch.randint(0, 100, (size,), generator=generator)
    seq_lens = (positions + 1).int()
    rows = torch.arange(1, size + 1)
    return ForwardBatch(mode, size, ids, positions, seq_lens, rows, rows.clone(), int(seq_lens.sum()), seq_lens)


def captured_runner(
    model_runner, config=None, backend_kind: Backend = Backend.FULL, **backend_options
) -> tuple[DecodeCudaGraphRunner, CpuReplayBackend]:
    """A decode runner of ``model_runner`` captured through the CPU test double standing in for ``backend_kind``."""
    backend = CpuReplayBackend(backend_kind, **backend_options)
    runner = DecodeCudaGraphRunner(
        model_runner, config or model_runner.cuda_graph_config, backend=backend, show_progress=False
    )
    runner.capture()
    return runner, backend


def decode_batch(model_runner, batch_size: int, seed: int = 0) -> ForwardBatch:
    """A decode step of ``batch_size`` fresh requests, their prompts cached by an eager extend step."""
    requests = admit(model_runner, prompts_of([3 + (i % 5) for i in range(batch_size)], seed=seed))
    prefill_eagerly(model_runner, requests)
    return make_decode_batch(requests, model_runner.device)
