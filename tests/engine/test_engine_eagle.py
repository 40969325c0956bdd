"""EAGLE drafting on the CPU: an EAGLE head over the target's hidden states drafts, the target verifies, and the
tokens are exactly plain greedy decoding's (lossless), with a random head (drafts rarely accepted) and with the
self-draft head over a one-layer target (every draft accepted: ``k + 1`` tokens a verify step). The draft runners'
graphs (chain and extend) stand in through ``CpuReplayBackend`` (full and breakable) and give exactly the drafts of
the eager path; the target's own verify graph (the double) hands its hidden states over from inside the graph.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from cudagraph.backend.testing import CpuReplayBackend
from cudagraph.config import Backend, CudaGraphConfig, PhaseConfig
from cudagraph.engine.batch import Request, SamplingParams
from cudagraph.engine.eagle import EagleModelRunner
from cudagraph.engine.generate import GenerationStats, Scheduler, StepPolicy
from cudagraph.engine.model import ModelLoadError, model_config_from_preset, random_model
from cudagraph.engine.model.eagle import (
    EagleHead,
    eagle_head_from_source,
    load_eagle_head,
    random_eagle_head,
    save_eagle_head,
    self_draft_head,
)
from cudagraph.engine.model_runner import CacheConfig, ModelRunner
from cudagraph.engine.speculative import EagleDrafter
from cudagraph.runner import DecodeCudaGraphRunner

CONFIG = CudaGraphConfig(
    decode=PhaseConfig(Backend.FULL, (1, 2, 4), 4), prefill=PhaseConfig(Backend.BREAKABLE, (16, 32, 64), 64)
)
PRESET = "tiny-qwen3-random"


def target(num_layers: int = 2, keep_hidden_states: int = 0) -> ModelRunner:
    config = model_config_from_preset(PRESET)
    if num_layers != config.num_layers:
        config = config.with_overrides(num_layers=num_layers)
    model = random_model(config, seed=0, dtype="float32")
    cache = CacheConfig(8, max_context_len=96)
    return ModelRunner(model, CONFIG, cache_config=cache, keep_hidden_states=keep_hidden_states)


def workload(count: int = 4) -> tuple[list[list[int]], list[SamplingParams]]:
    """Prompts of several lengths; prompt ``i`` wants ``1 + 4 (i + 1)`` tokens, so requests finish one by one and the
    running batch walks down through every size."""
    generator = torch.Generator().manual_seed(0)
    lengths = (5, 9, 3, 12, 7, 4)[:count]
    prompts = [torch.randint(0, 512, (length,), generator=generator).tolist() for length in lengths]
    return prompts, [SamplingParams(max_new_tokens=1 + 4 * (index + 1)) for index in range(count)]


@pytest.fixture(scope="module")
def greedy() -> dict[int, list[list[int]]]:
    """Plain greedy decoding's tokens, by the target's layer count."""
    return {layers: [o.output_token_ids for o in Scheduler(target(layers)).run(*workload())] for layers in (1, 2)}


@dataclasses.dataclass
class EagleRun:
    tokens: list[list[int]]
    drafts: list[list[list[int]]]
    stats: GenerationStats
    drafter: EagleDrafter


def run_eagle(
    head: str, num_tokens: int, *, num_layers: int = 2, draft_graphs: Backend | None = None, verify_graph: bool = False
) -> EagleRun:
    """Speculative decoding of ``workload`` with an EAGLE head (``random`` or ``self``), recording every proposal."""
    model_runner = target(num_layers, keep_hidden_states=num_tokens + 1)
    if verify_graph:
        runner = DecodeCudaGraphRunner(
            model_runner, CONFIG, backend=CpuReplayBackend(Backend.FULL), show_progress=False, query_len=num_tokens + 1
        )
        runner.capture()
        model_runner.verify_cuda_graph_runner = runner
    eagle_runner = EagleModelRunner(model_runner, eagle_head_from_source(head, model_runner.model, seed=1), num_tokens)
    if draft_graphs is not None:
        eagle_runner.init_cuda_graphs(CpuReplayBackend(draft_graphs))
    drafter = EagleDrafter(eagle_runner)
    proposals: list[list[list[int]]] = []
    propose = drafter.propose_batch

    def recording(requests):  # type: ignore[no-untyped-def]
        proposals.append(propose(requests))
        return proposals[-1]

    drafter.propose_batch = recording  # type: ignore[method-assign]
    scheduler = Scheduler(model_runner, policy=StepPolicy(drafter=drafter))
    tokens = [output.output_token_ids for output in scheduler.run(*workload())]
    return EagleRun(tokens, proposals, scheduler.stats, drafter)


@pytest.mark.parametrize("num_tokens", [1, 3])
def test_a_random_head_s_drafting_gives_exactly_the_greedy_tokens(greedy, num_tokens: int) -> None:
    run = run_eagle("random", num_tokens)
    assert run.tokens == greedy[2]
    assert run.stats.verify_steps > 0 and run.stats.decode_steps == 0
    assert run.stats.accepted_tokens < run.stats.drafted_tokens  # a random head is mostly wrong
    assert not run.drafter.seeds, "every finished request's seed was released"


@pytest.mark.parametrize("num_tokens", [2, 3])
def test_the_self_draft_head_has_every_draft_accepted_k_plus_one_tokens_a_step(greedy, num_tokens: int) -> None:
    run = run_eagle("self", num_tokens, num_layers=1)
    assert run.tokens == greedy[1]
    assert run.stats.accepted_tokens == run.stats.drafted_tokens > 0
    if num_tokens == 3:  # every request wants 1 + 4 n tokens: the prefill's, then n verify steps of k + 1 each
        request_steps = run.stats.drafted_tokens // num_tokens  # a verify step of a request drafts k
        assert (num_tokens + 1) * request_steps == sum(len(tokens) - 1 for tokens in greedy[1])
        assert run.stats.verify_steps == max(len(tokens) - 1 for tokens in greedy[1]) // (num_tokens + 1)


@pytest.mark.parametrize("kind", [Backend.FULL, Backend.BREAKABLE])
@pytest.mark.parametrize(("head", "num_layers"), [("random", 2), ("self", 1)])
def test_graphed_drafting_proposes_exactly_the_eager_drafts(greedy, kind: Backend, head: str, num_layers: int) -> None:
    eager = run_eagle(head, 3, num_layers=num_layers)
    graphed = run_eagle(head, 3, num_layers=num_layers, draft_graphs=kind, verify_graph=True)
    assert graphed.tokens == eager.tokens == greedy[num_layers]
    assert graphed.drafts == eager.drafts
    eagle_runner = graphed.drafter.model_runner
    chain, extend = eagle_runner.draft_cuda_graph_runner, eagle_runner.draft_extend_cuda_graph_runner
    assert chain is not None and extend is not None
    assert chain.metrics.replays == graphed.stats.verify_steps and chain.metrics.eager == 0
    assert extend.metrics.replays > 0 and extend.metrics.eager == 0
    sizes = [size for size, count in enumerate(chain.metrics.replays_by_size) if count and size]
    assert sizes == [1, 2, 3, 4], "the running batch walked down through every size (3 padded to the bucket of 4)"


def test_the_target_s_verify_graph_hands_its_hidden_states_over(greedy) -> None:
    """With the target's verify step replayed from its graph double, the hidden states the drafter reads were
    written inside the captured forward: the self-draft head still has every draft accepted."""
    run = run_eagle("self", 3, num_layers=1, verify_graph=True)
    assert run.tokens == greedy[1]
    assert run.stats.accepted_tokens == run.stats.drafted_tokens


def test_a_saved_head_loads_back_and_drafts_the_same(tmp_path: Path) -> None:
    model = random_model(model_config_from_preset(PRESET), seed=0, dtype="float32")
    head = random_eagle_head(model, seed=4)
    save_eagle_head(head, tmp_path / "head")
    loaded = load_eagle_head(tmp_path / "head", model)
    for (name, saved), (_, back) in zip(head.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert torch.equal(saved, back), name
    assert set(dict(head.named_parameters())) == {name for name, _ in loaded.named_parameters()}
    assert "embed_tokens" not in " ".join(dict(head.named_parameters())), "the embedding is the target's, shared"


def test_loading_a_head_of_another_vocabulary_is_one_clear_error(tmp_path: Path) -> None:
    model = random_model(model_config_from_preset(PRESET), seed=0, dtype="float32")
    other = random_model(model_config_from_preset(PRESET).with_overrides(vocab_size=256), seed=0, dtype="float32")
    save_eagle_head(random_eagle_head(other), tmp_path / "head")
    with pytest.raises(ModelLoadError, match=r"vocab_size is 256, the target's is 512"):
        load_eagle_head(tmp_path / "head", model)
    with pytest.raises(FileNotFoundError, match=r"has no config\.json"):
        load_eagle_head(tmp_path / "nowhere", model)


def test_the_self_draft_head_needs_a_one_layer_target() -> None:
    model = random_model(model_config_from_preset(PRESET), seed=0, dtype="float32")
    with pytest.raises(ModelLoadError, match=r"one-layer target; this target has 2 layers"):
        self_draft_head(model)


def test_the_self_draft_head_computes_the_target_s_hidden_states() -> None:
    from cudagraph.engine.model import dense_attend

    config = model_config_from_preset(PRESET).with_overrides(num_layers=1)
    model = random_model(config, seed=2, dtype="float32")
    head: EagleHead = self_draft_head(model)
    ids, positions = torch.tensor([3, 1, 4, 1, 5]), torch.arange(5)
    noise = torch.randn(5, config.hidden_size)  # the hidden states handed over: the [I | 0] fc ignores them
    expected = model(ids, positions, dense_attend(config))
    torch.testing.assert_close(head(ids, positions, noise, dense_attend(config)), expected, rtol=0, atol=1e-6)


def test_a_drafter_refuses_a_target_that_keeps_no_hidden_states() -> None:
    keeping, plain = target(keep_hidden_states=4), target()
    drafter = EagleDrafter(EagleModelRunner(keeping, random_eagle_head(keeping.model), 3))
    with pytest.raises(ValueError, match="keep_hidden_states=4"):
        EagleDrafter(EagleModelRunner(plain, random_eagle_head(plain.model), 3)).check_target(plain)
    with pytest.raises(ValueError, match="built for another target"):
        drafter.check_target(plain)
    with pytest.raises(RuntimeError, match="has no EAGLE seed"):
        drafter.propose_batch([Request(0, [1, 2], SamplingParams())])
