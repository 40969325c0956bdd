"""Speculative verify steps on the triton attention backend (the extend kernel over rows made from the step's shapes)
against the torch backend's, eagerly and replayed from the verify runner's full-graph double. The kernels run on a
CUDA device where there is one and through Triton's interpreter on CPU tensors elsewhere (``tests/conftest.py``)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip(
    "triton", reason="the triton attention backend needs triton: pip install triton (CUDA builds of torch bring it)"
)

from cudagraph.backend.testing import CpuReplayBackend
from cudagraph.config import Backend, CudaGraphConfig, PhaseConfig
from cudagraph.engine.batch import Request, SamplingParams, make_extend_batch, make_verify_batch
from cudagraph.engine.model import model_config_from_preset, random_model
from cudagraph.engine.model_runner import CacheConfig, ModelRunner
from cudagraph.runner import DecodeCudaGraphRunner

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
CONFIG = CudaGraphConfig(
    decode=PhaseConfig(Backend.FULL, (1, 2, 4), 4), prefill=PhaseConfig(Backend.BREAKABLE, (16, 32), 32)
)


def engine(attention: str) -> ModelRunner:
    model = random_model(model_config_from_preset("tiny-qwen3-random"), seed=0, dtype="float32", device=DEVICE)
    return ModelRunner(model, CONFIG, cache_config=CacheConfig(8, max_context_len=48), attention_backend=attention)


def verify_logits(model_runner: ModelRunner, replay: bool) -> torch.Tensor:
    """Logits of one verify step (3 requests, 3 drafts each) after an eager prefill of the same prompts."""
    generator = torch.Generator().manual_seed(5)
    requests = []
    for index, length in enumerate((5, 11, 2)):
        prompt = torch.randint(0, 512, (length,), generator=generator).tolist()
        requests.append(model_runner.hold(Request(index, prompt, SamplingParams(max_new_tokens=4), lookahead=3)))
    first = model_runner.forward(make_extend_batch(requests, model_runner.device)).argmax(-1).tolist()
    for request, token in zip(requests, first, strict=True):
        request.cached_len = len(request.token_ids)
        request.output_ids.append(token)
    drafts = [torch.randint(0, 512, (3,), generator=generator).tolist() for _ in requests]
    batch = make_verify_batch(requests, drafts, model_runner.device)
    if not replay:
        return model_runner.forward(batch).clone()
    runner = DecodeCudaGraphRunner(
        model_runner, CONFIG, backend=CpuReplayBackend(Backend.FULL), show_progress=False, query_len=4
    )
    runner.capture()
    return runner.replay(batch).clone()


def test_triton_verify_steps_match_the_torch_backend_eagerly_and_replayed() -> None:
    expected = verify_logits(engine("torch"), replay=False)
    torch.testing.assert_close(verify_logits(engine("triton"), replay=False), expected, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(verify_logits(engine("triton"), replay=True), expected, rtol=1e-4, atol=1e-4)
