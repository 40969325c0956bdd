"""Qwen3-MoE through the engine on the CPU: a checkpoint served eagerly and replayed through the full and
breakable test doubles gives Transformers' greedy tokens and logits; and the experts split over two gloo ranks
(expert parallel, one all-reduce per sparse block, or tokens exchanged with the experts' ranks by all-to-all) give
the single-rank tokens and logits, the breakable double breaking at every all-to-all. ``nox -s tests`` launches the
experts split over two ranks with Qwen3-MoE; the all-to-all exchange over two ranks and Mixtral are ``slow`` (the
exchange itself is checked in one process by ``tests/engine_model/test_model_moe_a2a.py``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import tp_workers
from test_engine_tensor_parallel import FLOAT32_LOGITS, single_rank_outputs

from cudagraph.backend.testing import CpuReplayBackend
from cudagraph.config import Backend, CudaGraphConfig, PhaseConfig
from cudagraph.engine import commands
from cudagraph.engine.batch import Request, SamplingParams, make_decode_batch, make_extend_batch
from cudagraph.engine.distributed import launch
from cudagraph.engine.generate import generate
from cudagraph.engine.model import load_model, model_config_from_preset, random_model, save_model
from cudagraph.engine.model_runner import CacheConfig, ModelRunner
from cudagraph.runner import DecodeCudaGraphRunner

transformers = pytest.importorskip(
    "transformers", reason=("compares with transformers: pip install transformers (`nox -s tests` does)")
)

PROMPTS = ([11, 400, 3, 77], [250, 9, 9, 130, 61, 500, 2], [42], [7, 8, 9, 10, 11, 12])
NEW_TOKENS = (6, 4, 3, 2)
"""Prefill gives every request its first token and requests then finish one after another: decode steps run 4, 3
(padded to 4), 2 and 1 requests."""
DECODE_BUCKETS = (1, 2, 4)


@pytest.fixture(scope="module")
def hf_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, Path]:
    """A tiny Qwen3-MoE checkpoint (a dense layer among sparse ones) with random weights, and Transformers' model
    of it."""
    config = model_config_from_preset("tiny-qwen3-moe-random").with_overrides(mlp_only_layers=(1,))
    directory = tmp_path_factory.mktemp("qwen3-moe")
    save_model(random_model(config, seed=2), directory)
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    assert type(hf_model).__name__ == "Qwen3MoeForCausalLM"
    return hf_model, directory


def hf_greedy(hf_model: torch.nn.Module, prompt: list[int], steps: int) -> list[int]:
    sequence = list(prompt)
    with torch.no_grad():
        for _ in range(steps):
            sequence.append(int(hf_model(torch.tensor([sequence]), use_cache=False).logits[0, -1].argmax()))
    return sequence[len(prompt) :]


def engine(directory: Path, backend: Backend | None) -> ModelRunner:
    """The checkpoint served on the CPU; with ``backend``, decode steps replay graphs of the CPU test double."""
    graphs = CudaGraphConfig(
        decode=PhaseConfig(Backend.FULL, DECODE_BUCKETS, max(DECODE_BUCKETS)),
        prefill=PhaseConfig(Backend.DISABLED, (), 0),
    )
    model_runner = ModelRunner(load_model(directory), graphs, cache_config=CacheConfig(8, max_context_len=48))
    if backend is not None:
        runner = DecodeCudaGraphRunner(model_runner, graphs, backend=CpuReplayBackend(backend), show_progress=False)
        runner.capture()
        model_runner.decode_cuda_graph_runner = runner
    return model_runner


@pytest.mark.parametrize("backend", [None, Backend.FULL, Backend.BREAKABLE], ids=["eager", "full", "breakable"])
def test_served_moe_gives_transformers_greedy_tokens(hf_checkpoint, backend: Backend | None) -> None:
    hf_model, directory = hf_checkpoint
    model_runner = engine(directory, backend)
    params = [SamplingParams(max_new_tokens=n) for n in NEW_TOKENS]
    got = [out.output_token_ids for out in generate(model_runner, [list(p) for p in PROMPTS], params)]
    expected = [hf_greedy(hf_model, list(p), n) for p, n in zip(PROMPTS, NEW_TOKENS, strict=True)]
    assert got == expected
    runner = model_runner.decode_cuda_graph_runner
    if runner is not None:
        replayed = [size for size, count in enumerate(runner.metrics.replays_by_size) if count]
        assert replayed == [1, 2, 3, 4], "every decode batch size should have replayed a graph"


@pytest.mark.parametrize("backend", [Backend.FULL, Backend.BREAKABLE])
def test_replayed_moe_decode_logits_are_eager_and_transformers_logits(hf_checkpoint, backend: Backend) -> None:
    hf_model, directory = hf_checkpoint
    model_runner = engine(directory, backend)
    params = SamplingParams(max_new_tokens=4)
    requests = [model_runner.hold(Request(index, list(p), params)) for index, p in enumerate(PROMPTS[:3])]
    first = model_runner.forward(make_extend_batch(requests, model_runner.device)).argmax(-1).tolist()
    for request, token in zip(requests, first, strict=True):
        request.cached_len = len(request.token_ids)
        request.output_ids.append(token)
    batch = make_decode_batch(requests, model_runner.device)
    eager = model_runner.forward(batch).clone()
    replayed = model_runner.decode_cuda_graph_runner.replay(batch).clone()
    torch.testing.assert_close(replayed, eager, rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        expected = torch.stack(
            [hf_model(torch.tensor([r.token_ids]), use_cache=False).logits[0, -1].float() for r in requests]
        )
    torch.testing.assert_close(replayed, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "preset", ["tiny-qwen3-moe-random", pytest.param("tiny-mixtral-random", marks=pytest.mark.slow)]
)
def test_experts_split_over_two_ranks_give_single_rank_tokens_and_logits(preset: str) -> None:
    # Every rank routes every token and computes its half of the experts; the sparse block's all-reduce sums the
    # ranks' parts, as the row-parallel projections' does.
    expected_tokens, expected_logits = single_rank_outputs(preset, 1)
    got = launch(tp_workers.model_outputs, (preset, 1, "torch"), 2)
    assert got["tokens"] == expected_tokens
    for index, (have, want) in enumerate(zip(got["logits"], expected_logits, strict=True)):
        torch.testing.assert_close(have, want, **FLOAT32_LOGITS, msg=lambda m, i=index: f"prompt {i}: {m}")


@pytest.mark.parametrize(
    ("preset", "decode"),
    [
        pytest.param("tiny-qwen3-moe-random", "disabled", marks=pytest.mark.slow),
        pytest.param("tiny-qwen3-moe-random", "breakable", marks=pytest.mark.slow),
        pytest.param("tiny-qwen3-moe-random", "full", marks=pytest.mark.slow),
        pytest.param("tiny-mixtral-random", "disabled", marks=pytest.mark.slow),
        pytest.param("tiny-mixtral-random", "breakable", marks=pytest.mark.slow),
    ],
)
def test_experts_exchanging_tokens_over_two_ranks_give_single_rank_tokens_and_logits(preset: str, decode: str) -> None:
    # moe_a2a_backend="all_to_all": each rank routes half the tokens, sends them to the experts' ranks and combines
    # what comes back; the breakable double must break at both all-to-alls of every sparse block (and a full
    # capture records them as graph work).
    expected_tokens, expected_logits = single_rank_outputs(preset, 1)
    got = launch(tp_workers.moe_a2a_outputs, (preset, decode), 2)
    assert got["tokens"] == expected_tokens
    for index, (have, want) in enumerate(zip(got["logits"], expected_logits, strict=True)):
        torch.testing.assert_close(have, want, **FLOAT32_LOGITS, msg=lambda m, i=index: f"prompt {i}: {m}")
    if decode == "disabled":
        return
    assert got["replayed"] == [4], "the four requests' decode steps should have replayed the bucket of 4"
    config = model_config_from_preset(preset)
    sparse = sum(config.uses_experts(layer) for layer in range(config.num_layers))
    # Breakable: one attention break per layer and both all-to-alls of every sparse block; full: no break at all.
    if decode == "breakable":
        per_bucket = {"eager": config.num_layers + 2 * sparse, "all_to_all": 2 * sparse}
    else:
        per_bucket = {"eager": 0, "all_to_all": 0}
    assert got["breaks"] == dict.fromkeys(tp_workers.A2A_DECODE_BUCKETS, per_bucket)


MOE_GENERATE = ["generate", "--preset", "tiny-qwen3-moe-random", "--device", "cpu", "--prompt-token-ids", "5,6,7,8"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--preset", "tiny-qwen3-random", "--tp-size", "2", "--moe-a2a-backend", "all_to_all"],
            "--moe-a2a-backend all_to_all: the model has no sparse experts",
        ),
        (["--all2all-backend", "all_to_all"], "--tp-size is 1 (one rank holds every expert)"),
    ],
)
def test_bad_moe_a2a_flags_are_one_clear_error(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert commands.main([*MOE_GENERATE, *flags]) == commands.EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1] and "Traceback" not in "\n".join(err)


def test_an_unknown_a2a_backend_is_refused_by_the_parser_naming_the_choices(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        commands.build_parser().parse_args([*MOE_GENERATE, "--all2all-backend", "deepep"])
    assert "invalid choice: 'deepep' (choose from 'none', 'all_to_all')" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--moe-a2a-backend", "--all2all-backend"])
def test_sglangs_and_vllms_spellings_set_the_same_a2a_backend(flag: str) -> None:
    assert commands.build_parser().parse_args([*MOE_GENERATE, flag, "all_to_all"]).moe_a2a_backend == "all_to_all"
    assert commands.build_parser().parse_args(MOE_GENERATE).moe_a2a_backend == "none"


@pytest.mark.slow  # deep: the CLI over two ranks; the two-rank exchange itself stays fast (above)
def test_cli_generate_at_tp2_with_all_to_all_prints_the_single_rank_tokens(capsys: pytest.CaptureFixture[str]) -> None:
    prompts = ["--max-new-tokens", "5", "--json", "-q", "--kernel-backend", "torch"]
    assert commands.main([*MOE_GENERATE, *prompts]) == 0
    single = json.loads(capsys.readouterr().out)
    exchanging = ["--tp-size", "2", "--moe-a2a-backend", "all_to_all"]
    assert commands.main([*MOE_GENERATE, *prompts, *exchanging]) == 0
    assert json.loads(capsys.readouterr().out)["outputs"] == single["outputs"]
