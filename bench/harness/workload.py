"""The model, its engine, and the batches every configuration runs: decode batches of ``batch_size`` requests with
``context_len`` cached tokens, extend batches of whole prompts, speculative verify steps and extend steps mixing
running requests with a prompt chunk, each with rotating copies (same requests and KV slots, different token ids in
new tensors) so a step never sees the tensors of the step before.

Also the correctness gate: a configuration's greedy tokens against eager's on the same batch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from cudagraph.config import Backend, CudaGraphConfig, PhaseConfig
from cudagraph.engine.batch import Request, SamplingParams, make_extend_batch, make_verify_batch
from cudagraph.engine.model import random_model
from cudagraph.engine.model_runner import CacheConfig, ModelRunner
from cudagraph.engine.testing import release_synthetic_batch, synthetic_decode_batch
from cudagraph.runner import ForwardBatch, ForwardMode

from .presets import preset_config

EAGER_CONFIG = CudaGraphConfig(PhaseConfig(Backend.DISABLED, (), 0), PhaseConfig(Backend.DISABLED, (), 0))
"""The engine itself stays eager: every runner under test is built by its section."""

ROTATING_INPUTS = 4
"""Copies of every batch that the timed steps cycle through."""

TIE_TOLERANCE = 0.5
"""A token that differs from eager's is a tie, not an error, when eager's logit for it is within this of eager's
best. The presets' logits have unit spread. Rows that replay eager's kernels match them to a few bf16 ulps; inductor's
kernels do not: on the H100 at batch 256 they moved logits by up to 0.28-0.31 (both the compiled full graph and
tc_piecewise's pieces), which flips any top-two pair closer than the two logits' moves together."""

LOGIT_TOLERANCE = 1.0
"""The most any logit may move from eager's (one unit of logit spread, about 3x inductor's measured worst): a row
whose tokens all survive but whose logits moved further computes something else."""


def build_model_runner(
    preset: str,
    cache: CacheConfig,
    attention_backend: str,
    model: torch.nn.Module | None = None,
    kernel_backend: str = "auto",
    cuda_graph_config: CudaGraphConfig = EAGER_CONFIG,
    enable_sleep_mode: bool = False,
) -> ModelRunner:
    """An engine on CUDA over the preset's random bf16 weights (or ``model``'s, shared between engines), with the
    kernel set ``kernel_backend`` picks (``auto``: the fastest that can run; a traced forward never gets
    FlashInfer's). Eager unless ``cuda_graph_config`` says otherwise (its runners are built by the caller:
    ``init_*_cuda_graph``); ``enable_sleep_mode``: weights, KV cache and graphs in sleepable memory."""
    if model is None:
        model = random_model(preset_config(preset), seed=0, dtype="bfloat16", device="cuda")
    return ModelRunner(
        model,
        cuda_graph_config,
        cache_config=cache,
        attention_backend=attention_backend,  # type: ignore[arg-type]
        kernel_backend=kernel_backend,
        enable_sleep_mode=enable_sleep_mode,
    )


def rotations(batch: ForwardBatch, vocab_size: int, count: int = ROTATING_INPUTS, seed: int = 0) -> list[ForwardBatch]:
    """``batch`` and ``count - 1`` copies with fresh tensors and other token ids below ``vocab_size`` (same requests,
    same KV slots)."""
    # Offset from the seed the batch itself was drawn with, or the first copy would repeat its token ids.
    generator = torch.Generator().manual_seed(seed + 7919)
    copies = [batch]
    for _ in range(count - 1):
        ids = torch.randint(0, vocab_size, tuple(batch.input_ids.shape), generator=generator).to(batch.input_ids.device)
        fresh = {
            field.name: getattr(batch, field.name).clone()
            for field in dataclasses.fields(batch)
            if isinstance(getattr(batch, field.name), torch.Tensor)
        }
        copies.append(dataclasses.replace(batch, **{**fresh, "input_ids": ids}))
    return copies


@contextmanager
def decode_batches(model_runner: ModelRunner, batch_size: int, context_len: int) -> Iterator[list[ForwardBatch]]:
    """Rotating decode batches of ``batch_size`` requests; their rows and slots are given back on exit."""
    batch = synthetic_decode_batch(model_runner, batch_size, context_len, seed=batch_size)
    try:
        yield rotations(batch, model_runner.model.config.vocab_size, seed=batch_size)
    finally:
        release_synthetic_batch(model_runner, batch, context_len)


@contextmanager
def extend_batches(model_runner: ModelRunner, requests: int, tokens: int) -> Iterator[list[ForwardBatch]]:
    """Rotating extend batches: ``requests`` fresh prompts of ``tokens`` tokens each, nothing cached yet."""
    device = model_runner.device
    rows, slots = [], []
    for _ in range(requests):
        row = model_runner.req_to_token_pool.alloc()
        request_slots = model_runner.token_to_kv_pool.alloc(tokens)
        model_runner.req_to_token_pool.write(row, 0, request_slots)
        rows.append(row)
        slots.append(request_slots)
    generator = torch.Generator().manual_seed(requests * tokens)
    vocab = model_runner.model.config.vocab_size
    seq_lens_cpu = torch.full((requests,), tokens, dtype=torch.int32)
    batch = ForwardBatch(
        forward_mode=ForwardMode.EXTEND,
        batch_size=requests,
        input_ids=torch.randint(0, vocab, (requests * tokens,), generator=generator).to(device),
        positions=torch.arange(tokens, dtype=torch.int64).repeat(requests).to(device),
        seq_lens=seq_lens_cpu.to(device),
        req_pool_indices=torch.tensor(rows, dtype=torch.int64, device=device),
        out_cache_loc=torch.cat(slots).to(device),
        seq_lens_sum=requests * tokens,
        seq_lens_cpu=seq_lens_cpu,
        extend_seq_lens=torch.full((requests,), tokens, dtype=torch.int32, device=device),
        extend_prefix_lens=torch.zeros(requests, dtype=torch.int32, device=device),
        extend_start_loc=torch.arange(0, requests * tokens, tokens, dtype=torch.int32, device=device),
        extend_num_tokens=requests * tokens,
        extend_seq_lens_cpu=[tokens] * requests,
        extend_prefix_lens_cpu=[0] * requests,
    )
    try:
        yield rotations(batch, vocab, seed=requests * tokens)
    finally:
        for row, request_slots in zip(rows, slots, strict=True):
            model_runner.token_to_kv_pool.free(request_slots)
            model_runner.req_to_token_pool.free(row)


def _cached_requests(
    model_runner: ModelRunner, count: int, context_len: int, lookahead: int, seed: int
) -> list[Request]:
    """``count`` held requests with ``context_len`` prompt tokens cached (one eager extend step) and the token it
    gave appended; each keeps ``lookahead`` KV slots past its budget for drafts."""
    generator = torch.Generator().manual_seed(seed)
    vocab = model_runner.model.config.vocab_size
    requests = []
    for index in range(count):
        prompt = torch.randint(0, vocab, (context_len,), generator=generator).tolist()
        request = Request(index, prompt, SamplingParams(max_new_tokens=2), lookahead=lookahead)
        requests.append(model_runner.hold(request))
    try:
        logits = model_runner.forward(make_extend_batch(requests, model_runner.device))
    except BaseException:
        _release(model_runner, requests)
        raise
    for request, token in zip(requests, logits.argmax(-1).tolist(), strict=True):
        request.cached_len = len(request.token_ids)
        request.output_ids.append(token)
    return requests


def _release(model_runner: ModelRunner, requests: list[Request]) -> None:
    for request in requests:
        if request.kv_slots is not None:
            model_runner.release(request)


@contextmanager
def verify_batches(
    model_runner: ModelRunner, batch_size: int, drafts: int, context_len: int
) -> Iterator[list[ForwardBatch]]:
    """Rotating speculative verify batches: ``batch_size`` requests over ``context_len`` cached tokens, each its last
    token and ``drafts`` drafts (logits of every token); their rows and slots are given back on exit."""
    requests = _cached_requests(model_runner, batch_size, context_len, lookahead=drafts, seed=batch_size)
    try:
        draft_ids = [[request.token_ids[-1]] * drafts for request in requests]
        batch = make_verify_batch(requests, draft_ids, model_runner.device)
        yield rotations(batch, model_runner.model.config.vocab_size, seed=batch_size)
    finally:
        _release(model_runner, requests)


@contextmanager
def mixed_batches(
    model_runner: ModelRunner, running: int, chunk: int, context_len: int
) -> Iterator[list[ForwardBatch]]:
    """Rotating extend batches mixing ``running`` requests' next tokens (over ``context_len`` cached tokens) with a
    ``chunk``-token chunk of one more request's prompt (``chunk <= context_len``, nothing of it cached), the step a
    scheduler runs when a prompt arrives beside decoding requests; rows and slots are given back on exit."""
    if not 0 < chunk <= context_len:
        raise ValueError(f"a prompt chunk of {chunk} tokens needs 1 to context_len={context_len}")
    requests = _cached_requests(model_runner, running + 1, context_len, lookahead=0, seed=running * chunk)
    try:
        requests[-1].cached_len = 0  # its prompt goes again, as a chunk, beside the others' next tokens
        batch = make_extend_batch(requests, model_runner.device, [1] * running + [chunk])
        yield rotations(batch, model_runner.model.config.vocab_size, seed=running * chunk)
    finally:
        _release(model_runner, requests)


@dataclass(frozen=True)
class TokenCheck:
    """A configuration's greedy tokens against eager's on one batch."""

    rows: int
    differing: int
    """Rows whose token differs from eager's (ties included)."""
    wrong: int
    """Differing rows that are not ties: eager's logit for the token is more than ``TIE_TOLERANCE`` below its best."""
    max_abs_logit_diff: float

    @property
    def logits_close(self) -> bool:
        """Every logit within ``LOGIT_TOLERANCE`` of eager's."""
        return self.max_abs_logit_diff <= LOGIT_TOLERANCE

    @property
    def ok(self) -> bool:
        """No wrong token, and the logits close to eager's."""
        return self.wrong == 0 and self.logits_close

    def __str__(self) -> str:
        bound = "" if self.logits_close else f" (more than the {LOGIT_TOLERANCE:g} allowed)"
        return (
            f"{self.wrong} of {self.rows} greedy tokens wrong ({self.differing - self.wrong} near-ties), "
            f"max |logit - eager| {self.max_abs_logit_diff:.3g}{bound}"
        )


def check_tokens(eager_logits: torch.Tensor, logits: torch.Tensor) -> TokenCheck:
    """Compare greedy tokens of ``logits`` with those of ``eager_logits`` (both ``[rows, vocab]``)."""
    eager_logits, logits = eager_logits.float(), logits.float()
    if logits.shape != eager_logits.shape:
        return TokenCheck(eager_logits.shape[0], eager_logits.shape[0], eager_logits.shape[0], float("inf"))
    eager_tokens, tokens = eager_logits.argmax(-1), logits.argmax(-1)
    differing = eager_tokens != tokens
    best = eager_logits.gather(1, eager_tokens[:, None])[:, 0]
    chosen = eager_logits.gather(1, tokens[:, None])[:, 0]
    wrong = differing & (best - chosen > TIE_TOLERANCE)
    difference = (logits - eager_logits).abs().nan_to_num(nan=float("inf"))
    return TokenCheck(
        rows=int(eager_tokens.numel()),
        differing=int(differing.sum()),
        wrong=int(wrong.sum()),
        max_abs_logit_diff=float(difference.max()) if difference.numel() else 0.0,
    )


StepFn = Callable[[ForwardBatch], torch.Tensor]
"""One step of a configuration: the logits of a batch (rows sliced to the batch's requests)."""
