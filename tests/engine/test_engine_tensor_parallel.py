"""Tensor parallel on CPU with gloo: the sharded model against the single-rank one, the shard plan, shard loading,
the step broadcast, failing ranks and the CLI's flags.

Ranks are real processes (``launch`` spawns them), so each launch costs seconds on a small machine: every launch
checks as much as one run can show. ``nox -s tests`` launches the cheapest variant of each case (TP=2, one token a
page, a rank that raises); the other shapes, the TP=4 groups, the shared capture budget, the killed and the stuck
rank and the CLI's launch at TP=2 are marked ``slow`` (``nox -s slow``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
import tp_workers
from hypothesis import given
from hypothesis import strategies as st

from cudagraph.engine import commands
from cudagraph.engine.batch import Request, SamplingParams, make_decode_batch
from cudagraph.engine.distributed import RankFailedError, StepMessage, launch
from cudagraph.engine.generate import generate
from cudagraph.engine.kv_cache import ReqToTokenPool
from cudagraph.engine.model import (
    ModelConfig,
    ShardPlan,
    TensorParallelError,
    load_model,
    model_config_from_preset,
    random_model,
    reference_logits,
    save_model,
)
from cudagraph.engine.model import checkpoint as checkpoint_module
from cudagraph.engine.model.checkpoint import checkpoint_slots
from cudagraph.engine.model_runner import ModelRunner

FLOAT32_LOGITS = {"rtol": 1e-4, "atol": 1e-4}
"""Sharded against single-rank float32 logits: the only difference is the order of the partial sums (measured
differences are about 3e-6)."""


def single_rank_outputs(preset: str | ModelConfig, page_size: int) -> tuple[list[list[int]], list[torch.Tensor]]:
    model = random_model(tp_workers.config_of(preset), seed=5)
    cache = tp_workers.cache_config(page_size)
    runner = ModelRunner(model, tp_workers.EAGER, cache_config=cache, kernel_backend="torch")
    params = SamplingParams(max_new_tokens=tp_workers.NEW_TOKENS)
    tokens = [out.output_token_ids for out in generate(runner, [list(p) for p in tp_workers.PROMPTS], params)]
    return tokens, [reference_logits(model, prompt) for prompt in tp_workers.PROMPTS]


@pytest.mark.parametrize(
    ("preset", "world_size", "page_size"),
    [
        ("tiny-qwen3-random", 2, 1),  # 2 KV heads: one per rank
        pytest.param("tiny-llama-random", 2, 1, marks=pytest.mark.slow),  # 1 KV head: replicated on both ranks
        pytest.param("tiny-qwen3-random", 4, 1, marks=pytest.mark.slow),  # 2 KV heads over 4 ranks: each twice
        # pages of 16 tokens: every rank's cache holds its heads in the same pages
        pytest.param("tiny-llama-random", 2, 16, marks=pytest.mark.slow),
        pytest.param("tiny-qwen3-random", 4, 16, marks=pytest.mark.slow),
    ],
)
def test_sharded_model_gives_single_rank_tokens_and_logits(preset: str, world_size: int, page_size: int) -> None:
    # The torch kernel set, residual handed on unnormed: the o and down projections are all-reduced before the
    # next norm adds them, so every rank's stream is the single-rank one.
    expected_tokens, expected_logits = single_rank_outputs(preset, page_size)
    got = launch(tp_workers.model_outputs, (preset, page_size, "torch"), world_size)
    assert got["tokens"] == expected_tokens
    for index, (have, want) in enumerate(zip(got["logits"], expected_logits, strict=True)):
        torch.testing.assert_close(have, want, **FLOAT32_LOGITS, msg=lambda m, i=index: f"prompt {i}: {m}")
    assert got["initialized_after"] is False, "teardown should destroy the process group"


EIGHT_HEADS = model_config_from_preset("tiny-qwen3-random").with_overrides(num_heads=8, num_kv_heads=8, head_dim=16)
"""The tiny Qwen3 model with eight query and eight KV heads: one of each per rank at TP=8 (its own four heads cannot
be split eight ways)."""


@pytest.mark.slow
def test_eight_ranks_give_single_rank_tokens_and_logits() -> None:
    """TP=8 over gloo (what the eight-GPU run does with NCCL): every rank one query head, one KV head, an eighth of
    the MLP and of the vocabulary; eight ranks' all-reduced stream is the single rank's."""
    expected_tokens, expected_logits = single_rank_outputs(EIGHT_HEADS, 1)
    got = launch(tp_workers.model_outputs, (EIGHT_HEADS, 1, "torch"), 8)
    assert got["tokens"] == expected_tokens
    for index, (have, want) in enumerate(zip(got["logits"], expected_logits, strict=True)):
        torch.testing.assert_close(have, want, **FLOAT32_LOGITS, msg=lambda m, i=index: f"prompt {i}: {m}")
    assert got["initialized_after"] is False


def test_a_rank_that_raises_stops_the_group_with_its_error() -> None:
    started = time.monotonic()
    with pytest.raises(RankFailedError, match=r"rank 1 failed: ValueError: rank 1 cannot load its shard"):
        launch(tp_workers.raises_on_rank_1, None, 2)
    # Rank 0's collective would wait tp_workers.STOPPED_WAIT_S (180 s); starting two ranks takes seconds, and under a
    # loaded machine's worst seen well under a minute.
    assert time.monotonic() - started < 90, "the waiting rank should be stopped, not left in its collective"


@pytest.mark.slow  # a second failing launch; a rank that raises (above) stops the group the same way
def test_a_killed_rank_takes_the_group_down_with_one_error_naming_the_signal() -> None:
    started = time.monotonic()
    with pytest.raises(
        RankFailedError, match=r"^tensor-parallel rank 1 failed: killed by signal 9; stopped the other 1 rank$"
    ):
        launch(tp_workers.killed_on_rank_1, None, 2)
    # The launcher sees the dead process at once and stops rank 0 in its collective: the error names rank 1's signal,
    # not rank 0's collective timeout (tp_workers.STOPPED_WAIT_S, 180 s), and it comes well within it.
    assert time.monotonic() - started < 90, "the waiting rank should be stopped, not left in its collective"


@pytest.mark.slow
def test_a_stuck_rank_turns_into_a_timeout_not_a_hang() -> None:
    started = time.monotonic()
    with pytest.raises(RankFailedError, match=r"rank 0 failed"):
        launch(tp_workers.hangs_on_rank_1, 3.0, 2)
    # Without the 3 s timeout rank 0 would wait out rank 1's 120 s sleep, or the launcher its 60 s exit timeout; the
    # bound sits below both and leaves room for spawning two ranks on a loaded 2-core machine (32 s seen at load 15).
    assert time.monotonic() - started < 55, "rank 0 should give up after its 3 s collective timeout"


# -- the shard plan ---------------------------------------------------------------------------------------------


@given(
    kv_heads=st.sampled_from([1, 2, 4, 8]),
    group=st.sampled_from([1, 2, 4]),
    tp=st.sampled_from([1, 2, 4, 8]),
)
def test_every_rank_holds_the_kv_heads_its_query_heads_use(kv_heads: int, group: int, tp: int) -> None:
    config = model_config_from_preset("tiny-llama-random").with_overrides(
        num_heads=kv_heads * group, num_kv_heads=kv_heads, intermediate_size=64
    )
    plans = [ShardPlan(rank, tp, "tp") for rank in range(tp)]
    try:
        plans[0].check(config)
    except TensorParallelError:
        assert (kv_heads * group) % tp or (kv_heads % tp if kv_heads >= tp else tp % kv_heads)
        return
    for plan in plans:
        q, kv = plan.q_heads(config), plan.kv_heads(config)
        assert {head // group for head in range(q.start, q.stop)} <= set(range(kv.start, kv.stop))
        assert kv.size == plan.local_kv_heads(config)
    assert sorted(h for p in plans for h in range(p.q_heads(config).start, p.q_heads(config).stop)) == list(
        range(config.num_heads)
    )
    held = [head for plan in plans for head in range(plan.kv_heads(config).start, plan.kv_heads(config).stop)]
    assert sorted(set(held)) == list(range(kv_heads))
    assert len(held) == max(kv_heads, tp), "replicated only when there are fewer KV heads than ranks"


@pytest.mark.parametrize(
    ("tp", "message"),
    [(3, "must divide num_attention_heads"), (8, "must divide num_attention_heads")],
)
def test_a_size_the_heads_cannot_take_is_one_clear_error(tp: int, message: str) -> None:
    with pytest.raises(TensorParallelError, match=message):
        ShardPlan(0, tp, "tp").check(model_config_from_preset("tiny-llama-random"))


def test_a_size_that_neither_divides_nor_is_divided_by_the_kv_heads_is_refused() -> None:
    config = model_config_from_preset("tiny-llama-random").with_overrides(num_heads=12, num_kv_heads=3)
    with pytest.raises(TensorParallelError, match="num_key_value_heads"):
        ShardPlan(0, 2, "tp").check(config)


def test_vocabulary_rows_cover_the_vocabulary_once_with_the_last_rank_padded() -> None:
    config = model_config_from_preset("tiny-llama-random").with_overrides(vocab_size=509)
    ranges = [ShardPlan(rank, 4, "tp").vocab(config) for rank in range(4)]
    assert [r.start for r in ranges] == [0, 128, 256, 384] and ranges[-1].stop == 509
    assert ShardPlan(0, 4, "tp").vocab_per_rank(config) == 128


# -- loading a shard --------------------------------------------------------------------------------------------


class RecordingHandle:
    """A ``safe_open`` handle that counts the elements actually read, and refuses whole-tensor reads."""

    def __init__(self, handle, reads: dict[str, int]) -> None:
        self.handle, self.reads = handle, reads

    def get_slice(self, name: str):
        lazy, reads = self.handle.get_slice(name), self.reads

        class Recording:
            def get_shape(self):
                return lazy.get_shape()

            def __getitem__(self, index):
                tensor = lazy[index]
                reads[name] = reads.get(name, 0) + tensor.numel()
                return tensor

        return Recording()

    def get_tensor(self, name: str):
        raise AssertionError(f"{name} was read whole")

    def keys(self):
        return self.handle.keys()

    def __enter__(self):
        self.handle.__enter__()
        return self

    def __exit__(self, *exc):
        return self.handle.__exit__(*exc)


@pytest.mark.parametrize("preset", ["tiny-qwen3-random", "tiny-llama-random"])
def test_a_rank_reads_only_its_slices_and_holds_the_matching_part(
    preset: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = model_config_from_preset(preset)
    whole = random_model(config, seed=9)
    save_model(whole, tmp_path)
    reads: dict[str, int] = {}
    real_open = checkpoint_module.safe_open
    monkeypatch.setattr(checkpoint_module, "safe_open", lambda *a, **k: RecordingHandle(real_open(*a, **k), reads))
    plan = ShardPlan(rank=1, size=2, group_name="unused-by-loading")
    shard = load_model(tmp_path, shard=plan)

    expected_reads = {slot.hf_name: 0 for slot in checkpoint_slots(config, plan)}
    for slot in checkpoint_slots(config, plan):
        expected_reads[slot.hf_name] += slot.select(torch.empty(slot.shape)).numel()
    assert reads == expected_reads
    whole_elements = sum(slot.select(torch.empty(slot.shape)).numel() for slot in checkpoint_slots(config))
    assert sum(reads.values()) < 0.7 * whole_elements, "a rank of two should read about half the weights"
    # What it holds is the part of the whole model the plan names.
    for slot in checkpoint_slots(config, plan):
        full = checkpoint_slots(config)
        source = next(s for s in full if s.hf_name == slot.hf_name)
        want = slot.select(_as_checkpoint(source.target(whole), source))
        have = slot.target(shard)
        torch.testing.assert_close(have[0] if slot.broadcast else have, want, rtol=0, atol=0)
    local = plan.local_config(config)
    assert shard.layers[0].self_attn.qkv_weight.shape[0] == local.q_size + 2 * local.kv_size


def _as_checkpoint(rows: torch.Tensor, slot) -> torch.Tensor:
    return rows[0] if slot.broadcast else rows


# -- the step broadcast -----------------------------------------------------------------------------------------


def test_request_table_edits_make_a_second_table_equal() -> None:
    source, mirror = ReqToTokenPool(4, 32, "cpu"), ReqToTokenPool(4, 32, "cpu")
    source.start_recording()
    rows = [source.alloc() for _ in range(3)]
    for row in rows:
        source.write(row, 0, torch.arange(row * 10, row * 10 + 7))
    source.free(rows[1])
    source.write(rows[0], 7, torch.tensor([99, 98]))
    for edit in source.take_edits():
        mirror.apply(edit)
    assert torch.equal(mirror.req_to_token, source.req_to_token)
    assert source.take_edits() == [], "edits are handed out once"


def test_a_step_message_rebuilds_the_batch() -> None:
    request = Request(0, [4, 5, 6], SamplingParams())
    request.req_pool_index, request.kv_slots, request.cached_len = 2, torch.arange(10, 20), 3
    request.output_ids.append(8)
    batch = make_decode_batch([request], torch.device("cpu"))
    rebuilt = StepMessage.of(batch, []).batch_on(torch.device("cpu"))
    for name in ("input_ids", "positions", "seq_lens", "req_pool_indices", "out_cache_loc", "seq_lens_cpu"):
        assert torch.equal(getattr(rebuilt, name), getattr(batch, name)), name
    assert rebuilt.forward_mode == batch.forward_mode and rebuilt.seq_lens_sum == batch.seq_lens_sum


# -- the CLI ----------------------------------------------------------------------------------------------------

GENERATE = ["generate", "--preset", "tiny-llama-random", "--device", "cpu", "--prompt-token-ids", "1,2,3"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--tp-size", "2", "--tensor-parallel-size", "4"], "--tp-size 2 and --tensor-parallel-size 4 disagree"),
        (["--tp-size", "0"], "--tp-size 0: the tensor-parallel size must be at least 1"),
        (["--tensor-parallel-size", "3"], "must divide num_attention_heads"),
    ],
)
def test_bad_tensor_parallel_flags_are_one_clear_error(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert commands.main([*GENERATE, *flags]) == commands.EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1] and "Traceback" not in "\n".join(err)


@pytest.mark.parametrize("flag", ["--tp-size", "--tensor-parallel-size"])
def test_both_spellings_parse_to_the_same_size(flag: str) -> None:
    args = commands.build_parser().parse_args([*GENERATE, flag, "2"])
    assert commands.tp_size_of(args) == 2


@pytest.mark.parametrize(
    "engine_flags",
    [
        # the launch through the CLI: the sharded model's own test (above) and --tp-size's parsing stay fast
        pytest.param([], marks=pytest.mark.slow),
        pytest.param(["--page-size", "16", "--kernel-backend", "torch"], marks=pytest.mark.slow),
    ],
)
def test_cli_generate_at_tp2_prints_the_single_rank_tokens(
    engine_flags: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    prompts = ["--prompt-token-ids", "5,6,7,8", "--max-new-tokens", "6", "--json", "-q", *engine_flags]
    assert commands.main([*GENERATE, *prompts]) == 0
    single = json.loads(capsys.readouterr().out)
    assert commands.main([*GENERATE, *prompts, "--tp-size", "2"]) == 0
    sharded = json.loads(capsys.readouterr().out)
    assert sharded["outputs"] == single["outputs"]
    assert sharded["speed"]["generated_tokens"] == single["speed"]["generated_tokens"] == 6 * len(single["outputs"])


@pytest.mark.slow
def test_cli_ngram_speculation_at_tp2_gives_the_single_rank_greedy_tokens(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Rank 0 drafts and verifies; its verify steps go to the other rank like any step."""
    prompts = ["--prompt-token-ids", "5,6,7,5,6,7,5,6", "--prompt-token-ids", "1,2,3", "--max-new-tokens", "8"]
    prompts += ["--json", "-q"]
    assert commands.main([*GENERATE, *prompts]) == 0
    single = json.loads(capsys.readouterr().out)
    metrics = tmp_path / "metrics.json"
    speculating = ["--tp-size", "2", "--speculative-tokens", "2", "--cuda-graph-metrics", str(metrics)]
    assert commands.main([*GENERATE, *prompts, *speculating]) == 0
    assert json.loads(capsys.readouterr().out)["outputs"] == single["outputs"]
    assert json.loads(metrics.read_text())["verify"]["steps"] > 0


def test_a_draft_model_at_tp2_is_one_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    flags = ["--tp-size", "2", "--speculative-tokens", "2", "--speculative-draft", "tiny-llama-random"]
    assert commands.main([*GENERATE, *flags]) == commands.EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "a draft model runs on one process; with --tp-size use the n-gram drafter" in err[0]


def test_save_model_refuses_a_shard() -> None:
    config: ModelConfig = model_config_from_preset("tiny-llama-random")
    shard = random_model(config, shard=ShardPlan(0, 2, "tp"))
    with pytest.raises(TensorParallelError, match="rank 0 of 2"):
        save_model(shard, "/nonexistent")


@pytest.mark.slow
@pytest.mark.parametrize(("budgets_mib", "smallest"), [([60, 30], 1), ([60, 60, 22, 60], 2)], ids=["tp2", "tp4"])
def test_a_rank_with_a_smaller_budget_makes_every_rank_capture_its_buckets(
    budgets_mib: list[int], smallest: int
) -> None:
    """Each rank plans from its own budget; shared, the plan is the smallest one, every rank captures and keeps the
    same buckets (so the same steps replay everywhere) and the group finishes. Deciding alone, they differ."""
    alone = tp_workers.capture_within_budget(budgets_mib[smallest])
    expected = alone.captured_buckets
    assert 0 < len(expected) < len(tp_workers.BUDGET_BUCKETS)
    ranks = launch(tp_workers.capture_under_own_budget, (budgets_mib, True), len(budgets_mib))
    assert [tuple(rank["captured"]) for rank in ranks] == [expected] * len(budgets_mib)
    assert all(rank["routes"] == ranks[0]["routes"] for rank in ranks)
    left_out = {bucket: reason for bucket, reason in ranks[0]["skipped"].items() if bucket not in expected}
    assert left_out and all("another rank" in reason for reason in left_out.values())
    assert ranks[smallest]["skipped"] == dict(alone.skipped_buckets)
    unshared = launch(tp_workers.capture_under_own_budget, (budgets_mib, False), len(budgets_mib))
    assert tuple(unshared[0]["captured"]) != expected  # what the shared decision prevents


@pytest.mark.parametrize("decode", ["full", pytest.param("breakable", marks=pytest.mark.slow)])
def test_the_head_gathers_into_one_buffer_every_graph_shares_and_gives_single_rank_tokens(decode: str) -> None:
    """The vocabulary-parallel head's all-gather writes into one buffer the model runner reserved before capturing
    (rows of the largest bucket), on every rank: every captured bucket's gather, every replay's and every eager step
    that fits write at its one address; only an eager step larger than any graph gathers elsewhere. Tokens and logits
    stay the single-rank ones."""
    expected_tokens, expected_logits = single_rank_outputs("tiny-qwen3-random", 1)
    got = launch(tp_workers.shared_head_outputs, ("tiny-qwen3-random", decode), 2)
    assert got["tokens"] == expected_tokens
    for index, (have, want) in enumerate(zip(got["logits"], expected_logits, strict=True)):
        torch.testing.assert_close(have, want, **FLOAT32_LOGITS, msg=lambda m, i=index: f"prompt {i}: {m}")
    assert got["replayed"], "no decode step replayed a graph"
    largest = max(tp_workers.HEAD_DECODE_BUCKETS)
    for rank, seen in enumerate(got["ranks"]):
        address, rows = seen["buffer"]["address"], seen["buffer"]["rows"]
        assert rows == largest, f"rank {rank}: the buffer holds {rows} rows, not the largest bucket's {largest}"
        captured = seen["gathers"][: seen["captured"]]
        assert {gather_rows for gather_rows, _, _ in captured} == set(tp_workers.HEAD_DECODE_BUCKETS)
        in_graphs = [gather for gather in seen["gathers"] if gather[2]]
        if decode == "full":  # the full double replays by running the forward again; the breakable one replays
            # its recorded aten ops, which no Python-level recorder sees (as a CUDA graph's replay is not seen)
            assert len(in_graphs) > len(captured), f"rank {rank}: no replay gathered"
        fitting = [gather for gather in seen["gathers"] if gather[0] <= largest]
        assert {at for _, at, _ in fitting} == {address}, f"rank {rank}: a step that fits gathered elsewhere"
        larger = [gather for gather in seen["gathers"] if gather[0] > largest]
        assert larger and address not in {at for _, at, _ in larger}
