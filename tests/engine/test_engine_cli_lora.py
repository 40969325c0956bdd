"""LoRA adapters from ``cudagraph-engine generate``: every spelling (vLLM's and SGLang's), bad input as one line before
any model work, tokens equal to the adapter merged into the weights, and the report of which graph variant each step
went to (on the CPU graphs are off: every step eager, saying why)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from lora_helpers import base_model, engine, merged, random_adapter, write_peft

from cudagraph.engine import commands
from cudagraph.engine.batch import SamplingParams
from cudagraph.engine.commands import EXIT_USAGE, build_parser, main
from cudagraph.engine.generate import generate
from cudagraph.engine.lora import LoraAdapter, LoraConfig
from cudagraph.engine.lora_cli import LoraModule, lora_plan_of
from cudagraph.runner import EagerReason

PRESET = "tiny-llama-random"
BASE = ["generate", "--preset", PRESET, "--dtype", "float32", "--device", "cpu", "--max-new-tokens", "4"]
PROMPTS = [[5, 9, 2, 7], [11, 3, 8]]
GRAPHS_OFF = EagerReason.GRAPHS_UNAVAILABLE.text


def prompt_args(prompts: list[list[int]] = PROMPTS) -> list[str]:
    return [arg for prompt in prompts for arg in ("--prompt-token-ids", ",".join(map(str, prompt)))]


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two PEFT directories for the preset: ``sql`` of rank 4 and ``chat`` of rank 8."""
    root = tmp_path_factory.mktemp("adapters")
    model = base_model(PRESET)
    return {
        "sql": write_peft(random_adapter(model, rank=4, seed=11), root / "sql"),
        "chat": write_peft(random_adapter(model, rank=8, seed=12), root / "chat"),
    }


def _parse(*argv: str) -> object:
    return build_parser().parse_args([*BASE, *prompt_args(), *argv])


# -- spellings --------------------------------------------------------------------------------------------------------


def test_lora_modules_and_sglangs_lora_paths_are_one_list() -> None:
    args = _parse("--lora-modules", "a=/x", "b=/y", "--lora-paths", "c=/z")
    assert args.lora_modules == [LoraModule("a", Path("/x")), LoraModule("b", Path("/y")), LoraModule("c", Path("/z"))]
    assert _parse("--lora-paths", "a=/x").lora_modules == [LoraModule("a", Path("/x"))]
    assert _parse().lora_modules is None and _parse().enable_lora is False


def test_the_sizing_options_and_their_aliases_parse() -> None:
    args = _parse("--enable-lora", "--max-loras", "3", "--max-lora-rank", "8", "--lora-name", "a", "--lora-name", "-")
    assert (args.enable_lora, args.max_loras, args.max_lora_rank, args.lora_name) == (True, 3, 8, ["a", "-"])
    assert _parse("--max-loras-per-batch", "5").max_loras_per_batch == 5


def test_sglangs_max_loras_per_batch_sizes_the_slots_like_max_loras() -> None:
    for flag in ("--max-loras", "--max-loras-per-batch"):
        plan = lora_plan_of(_parse("--enable-lora", flag, "3", "--max-lora-rank", "2"))
        assert plan is not None and plan.config == LoraConfig(max_loras=3, max_rank=2)


def test_defaults_are_one_slot_per_adapter_at_their_largest_rank(adapters: dict[str, Path]) -> None:
    plan = lora_plan_of(_parse("--lora-modules", f"sql={adapters['sql']}", f"chat={adapters['chat']}"))
    assert plan is not None and plan.config == LoraConfig(max_loras=2, max_rank=8)
    assert plan.prompt_adapters == (None, None) and list(plan.adapters) == ["sql", "chat"]
    enabled = lora_plan_of(_parse("--enable-lora"))
    assert enabled is not None and enabled.config == LoraConfig(max_loras=1, max_rank=16) and not enabled.adapters
    assert lora_plan_of(_parse()) is None


def test_lora_name_once_is_every_prompt_and_per_prompt_in_order(adapters: dict[str, Path]) -> None:
    modules = ["--lora-modules", f"sql={adapters['sql']}", f"chat={adapters['chat']}"]
    once = lora_plan_of(_parse(*modules, "--lora-name", "chat"))
    each = lora_plan_of(_parse(*modules, "--lora-name", "-", "--lora-name", "sql"))
    assert once is not None and once.prompt_adapters == ("chat", "chat")
    assert each is not None and each.prompt_adapters == (None, "sql")


@pytest.mark.parametrize(
    ("item", "problem"),
    [
        ("sql", "'sql' is not NAME=PATH"),
        ("=/x", "'=/x' is not NAME=PATH"),
        ("sql=", "'sql=' is not NAME=PATH"),
        ("-=/x", "'-=/x': '-' names the base model in --lora-name"),
    ],
)
@pytest.mark.parametrize("flag", ["--lora-modules", "--lora-paths"])
def test_a_bad_module_item_is_a_usage_line(
    flag: str, item: str, problem: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main([*BASE, *prompt_args(), f"{flag}={item}"])  # attached: argparse reads a lone "-=/x" as an option
    assert exited.value.code == EXIT_USAGE
    assert capsys.readouterr().err.splitlines() == [
        f"cudagraph-engine generate: error: argument {flag}: {problem}; allowed: NAME=PATH, an adapter name and its "
        "PEFT directory, e.g. sql=/adapters/sql (see cudagraph-engine generate --help)"
    ]


# -- errors, before any model work ------------------------------------------------------------------------------------


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> str:
    """The one stderr line of a refused run; no model is built (building one fails the test)."""

    def no_model(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the model was built before the LoRA options were checked")

    monkeypatch.setattr(commands, "load_engine_model", no_model)
    assert main([*BASE, *prompt_args(), *argv]) == EXIT_USAGE
    captured = capsys.readouterr()
    assert captured.out == ""
    [line] = captured.err.splitlines()
    prefix = "cudagraph-engine generate: error: "
    assert line.startswith(prefix)
    return line.removeprefix(prefix)


def test_an_unknown_adapter_name_lists_the_loaded_ones(
    adapters: dict[str, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    argv = ["--lora-modules", f"sql={adapters['sql']}", f"chat={adapters['chat']}", "--lora-name", "math"]
    assert _refused(argv, capsys, monkeypatch) == (
        "--lora-name math: no adapter of that name; allowed: the --lora-modules names (sql, chat) or - (the base model)"
    )
    assert _refused(["--enable-lora", "--lora-name", "math"], capsys, monkeypatch) == (
        "--lora-name math: no adapter of that name; allowed: the --lora-modules names (none loaded) or - (the base "
        "model)"
    )


def test_a_directory_without_adapter_config_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "empty").mkdir()
    allowed = "allowed: a PEFT adapter directory (adapter_config.json and adapter_model.safetensors)"
    line = _refused(["--lora-modules", f"sql={tmp_path / 'empty'}"], capsys, monkeypatch)
    assert (
        line == f"--lora-modules sql={tmp_path / 'empty'}: {tmp_path / 'empty'} has no adapter_config.json; {allowed}"
    )
    line = _refused(["--lora-paths", f"sql={tmp_path / 'nowhere'}"], capsys, monkeypatch)
    assert line == f"--lora-modules sql={tmp_path / 'nowhere'}: {tmp_path / 'nowhere'} is not a directory; {allowed}"


def test_a_directory_without_weights_or_rank_is_named(
    adapters: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    no_weights = tmp_path / "no_weights"
    no_weights.mkdir()
    (no_weights / "adapter_config.json").write_bytes((adapters["sql"] / "adapter_config.json").read_bytes())
    line = _refused(["--lora-modules", f"sql={no_weights}"], capsys, monkeypatch)
    assert line == (
        f"--lora-modules sql={no_weights}: {no_weights} has no adapter_model.safetensors; allowed: a PEFT adapter "
        "directory (adapter_config.json and adapter_model.safetensors)"
    )
    no_rank = tmp_path / "no_rank"
    no_rank.mkdir()
    (no_rank / "adapter_config.json").write_text(json.dumps({"lora_alpha": 8}))
    (no_rank / "adapter_model.safetensors").write_bytes((adapters["sql"] / "adapter_model.safetensors").read_bytes())
    line = _refused(["--lora-modules", f"sql={no_rank}"], capsys, monkeypatch)
    assert line == f"--lora-modules sql={no_rank}: adapter_config.json has no 'r', the adapter's rank"


def test_an_adapter_of_a_module_the_engine_does_not_target_names_the_targets(
    adapters: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from safetensors.torch import save_file

    mlp = tmp_path / "mlp"
    mlp.mkdir()
    (mlp / "adapter_config.json").write_text(json.dumps({"r": 2, "lora_alpha": 4, "target_modules": ["gate_proj"]}))
    prefix = "base_model.model.model.layers.0.mlp.gate_proj"
    save_file(
        {f"{prefix}.lora_A.weight": torch.zeros(2, 64), f"{prefix}.lora_B.weight": torch.zeros(128, 2)},
        str(mlp / "adapter_model.safetensors"),
    )
    assert _refused(["--lora-modules", f"mlp={mlp}"], capsys, monkeypatch) == (
        f"--lora-modules mlp={mlp}: unknown LoRA target module 'gate_proj': the engine applies adapters to q_proj, "
        "k_proj, v_proj, o_proj (or q, k, v, o)"
    )


def test_save_peft_reads_back_equal(tmp_path: Path) -> None:
    adapter = random_adapter(base_model(PRESET), rank=3, seed=5, alpha=7.0)
    back = LoraAdapter.from_peft(adapter.save_peft(tmp_path / "a"))
    assert (back.rank, back.scaling, set(back.factors)) == (3, 7.0 / 3, set(adapter.factors))
    assert all(
        torch.equal(back.factors[key].a, f.a) and torch.equal(back.factors[key].b, f.b)
        for key, f in adapter.factors.items()
    )


def test_a_rank_above_max_lora_rank_names_the_adapter_and_both_ways_out(
    adapters: dict[str, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    argv = ["--lora-modules", f"sql={adapters['sql']}", f"chat={adapters['chat']}", "--max-lora-rank", "4"]
    assert _refused(argv, capsys, monkeypatch) == (
        f"--lora-modules chat={adapters['chat']}: its rank 8 is above --max-lora-rank 4; allowed: adapters of rank 4 "
        "or less, or --max-lora-rank 8 or more"
    )


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["--max-loras", "1"],
            "--max-loras 1 holds 1 adapters at once but --lora-modules names 2, all loaded at start; allowed: "
            "--max-loras 2 or more",
        ),
        (
            ["--max-loras-per-batch", "1"],
            "--max-loras-per-batch 1 holds 1 adapters at once but --lora-modules names 2, all loaded at start; "
            "allowed: --max-loras-per-batch 2 or more",
        ),
        (
            ["--max-loras", "2", "--max-loras-per-batch", "3"],
            "--max-loras 2 and --max-loras-per-batch 3 disagree: they are one setting, give one of them",
        ),
        (
            ["--lora-name", "sql", "--lora-name", "sql", "--lora-name", "sql"],
            "--lora-name is given 3 times for 2 prompts; allowed: once (every prompt) or once per --prompt-token-ids, "
            "in order",
        ),
        (
            ["--tp-size", "2"],
            "--tp-size 2 with LoRA adapters: a tensor-parallel shard cannot serve adapters yet; allowed: LoRA on one "
            "rank (--tp-size 1), or --tp-size without --enable-lora and --lora-modules",
        ),
    ],
)
def test_sizing_that_cannot_hold_the_adapters_is_one_line(
    argv: list[str],
    expected: str,
    adapters: dict[str, Path],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    modules = ["--lora-modules", f"sql={adapters['sql']}", f"chat={adapters['chat']}"]
    assert _refused([*modules, *argv], capsys, monkeypatch) == expected


def test_a_name_given_twice_is_refused(
    adapters: dict[str, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    argv = ["--lora-modules", f"sql={adapters['sql']}", "--lora-paths", f"sql={adapters['chat']}"]
    assert _refused(argv, capsys, monkeypatch) == (
        "--lora-modules names 'sql' twice; allowed: one PATH per adapter name"
    )


@pytest.mark.parametrize("flag", ["--max-loras", "--max-loras-per-batch", "--max-lora-rank", "--lora-name"])
def test_a_lora_option_without_lora_says_how_to_turn_it_on(
    flag: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    value = "sql" if flag == "--lora-name" else "2"
    assert _refused([flag, value], capsys, monkeypatch) == (
        f"{flag} is a LoRA option but LoRA is off: add --enable-lora, or --lora-modules NAME=PATH"
    )


def test_an_adapter_of_another_model_is_refused_before_any_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Read fine (a PEFT directory), but its layer count is not the model's: found when it is loaded into a slot.
    other = base_model("tiny-llama-random")
    adapter = random_adapter(other, rank=2, seed=3)
    wide = {(layer + len(other.layers), module): (f.a, f.b) for (layer, module), f in adapter.factors.items()}
    path = write_peft(type(adapter).from_tensors(wide), tmp_path / "deep")
    assert main([*BASE, *prompt_args(), "--lora-modules", f"deep={path}"]) == EXIT_USAGE
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines()[-1].startswith(
        f"cudagraph-engine generate: error: --lora-modules deep={path}: LoRA adapter has factors of layer "
        f"{len(other.layers)}; the model has {len(other.layers)} layers"
    )


# -- a run, and its report --------------------------------------------------------------------------------------------


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[dict[str, object], str]:
    assert main([*BASE, *prompt_args(), "--json", *argv]) == 0
    captured = capsys.readouterr()
    return json.loads(captured.out), captured.err


def _reference(adapters: dict[str, Path], names: list[str | None]) -> list[list[int]]:
    """Each prompt's greedy tokens from the preset with its adapter merged into the weights (an engine without LoRA)."""
    model = base_model(PRESET)
    outputs = []
    for prompt, name in zip(PROMPTS, names, strict=True):
        adapter = LoraAdapter.from_peft(adapters[name]) if name is not None else None
        [output] = generate(engine(merged(model, adapter), lora=None), [prompt], SamplingParams(max_new_tokens=4))
        outputs.append(output.output_token_ids)
    return outputs


def _variant(phase: str, variant: str, max_rank: int | None, eager: int) -> dict[str, object]:
    """A variant's JSON on the CPU: never graphed, every step eager because graphs need a CUDA device."""
    reasons = {GRAPHS_OFF: eager} if eager else {}
    return {
        "phase": phase,
        "variant": variant,
        "max_rank": max_rank,
        "graphed": False,
        "replayed": 0,
        "eager": eager,
        "eager_reasons": reasons,
    }


def test_prompts_through_their_adapters_give_the_merged_models_tokens(
    adapters: dict[str, Path], capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    modules = ["--lora-modules", f"sql={adapters['sql']}", "--lora-paths", f"chat={adapters['chat']}"]
    with caplog.at_level(logging.INFO, logger="cudagraph.engine"):
        result, _ = _run([*modules, "--lora-name", "chat", "--lora-name", "sql"], capsys)
    outputs = [output["output_token_ids"] for output in result["outputs"]]  # type: ignore[index]
    assert outputs == _reference(adapters, ["chat", "sql"])
    assert outputs != _reference(adapters, [None, None])  # the adapters change the tokens
    # Both prompts share each step: one prefill, then three decode steps, all of the LoRA variant, all eager here.
    assert result["graph_variants"] == [
        _variant("decode", "plain", None, 0),
        _variant("decode", "lora", 8, 3),
        _variant("prefill", "plain", None, 0),
        _variant("prefill", "lora", 8, 1),
    ]
    speed = result["speed"]
    assert isinstance(speed, dict) and (speed["steps_replayed"], speed["steps_eager"]) == (0, 4)
    [line] = [record.getMessage() for record in caplog.records if record.getMessage().startswith("graph variants:")]
    assert line == (
        "graph variants: decode plain 0 replayed, 0 eager; "
        f"decode lora (max rank 8) 0 replayed, 3 eager ({GRAPHS_OFF}); "
        "prefill plain 0 replayed, 0 eager; "
        f"prefill lora (max rank 8) 0 replayed, 1 eager ({GRAPHS_OFF})"
    )


def test_the_report_before_and_after_lora_is_on(
    adapters: dict[str, Path], capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    # Before: no LoRA option, the plain variants only. After: --lora-modules without --lora-name: the same tokens and
    # steps, every one on the plain variants, and a lora variant per phase that no step used.
    with caplog.at_level(logging.INFO, logger="cudagraph.engine"):
        before, _ = _run([], capsys)
        after, _ = _run(["--lora-modules", f"sql={adapters['sql']}"], capsys)
    assert after["outputs"] == before["outputs"]
    assert before["graph_variants"] == [_variant("decode", "plain", None, 3), _variant("prefill", "plain", None, 1)]
    assert after["graph_variants"] == [
        _variant("decode", "plain", None, 3),
        _variant("decode", "lora", 4, 0),
        _variant("prefill", "plain", None, 1),
        _variant("prefill", "lora", 4, 0),
    ]
    lines = [record.getMessage() for record in caplog.records if record.getMessage().startswith("graph variants:")]
    assert lines == [
        f"graph variants: decode plain 0 replayed, 3 eager ({GRAPHS_OFF}); prefill plain 0 replayed, 1 eager "
        f"({GRAPHS_OFF})",
        f"graph variants: decode plain 0 replayed, 3 eager ({GRAPHS_OFF}); decode lora (max rank 4) 0 replayed, 0 "
        f"eager; prefill plain 0 replayed, 1 eager ({GRAPHS_OFF}); prefill lora (max rank 4) 0 replayed, 0 eager",
    ]


def test_explain_names_the_variants_before_and_their_steps_after(
    adapters: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--lora-modules", f"sql={adapters['sql']}", "--lora-name", "sql", "--max-loras", "2", "--explain", "-q"]
    result, err = _run(argv, capsys)
    assert len(result["outputs"]) == len(PROMPTS)  # type: ignore[arg-type]
    lines = err.splitlines()
    # Before any model work: the config's provenance, then the variants each phase keeps.
    assert lines[0].startswith("decode.backend ") and "rule non_cuda_device" in lines[0]
    variants = "plain, lora (max rank 4, 2 slots, q_proj k_proj v_proj o_proj)"
    assert lines.index(f"decode.variants   {variants}") < lines.index(f"prefill.variants  {variants}")
    # After the run: each variant, whether graphed, and its steps.
    assert lines[-4:] == [
        "decode.variant.plain   not graphed; steps: 0 replayed, 0 eager",
        f"decode.variant.lora    not graphed, max rank 4; steps: 0 replayed, 3 eager ({GRAPHS_OFF})",
        "prefill.variant.plain  not graphed; steps: 0 replayed, 0 eager",
        f"prefill.variant.lora   not graphed, max rank 4; steps: 0 replayed, 1 eager ({GRAPHS_OFF})",
    ]


def test_cuda_graph_metrics_hold_each_phases_lora_variant(
    adapters: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "metrics.json"
    argv = ["--lora-modules", f"sql={adapters['sql']}", "--lora-name", "-", "--lora-name", "sql"]
    _, err = _run([*argv, "--cuda-graph-metrics", str(path)], capsys)
    metrics = json.loads(path.read_text())
    assert sorted(metrics) == ["decode", "decode lora", "prefill", "prefill lora"]
    assert [metrics[name]["steps"] for name in ("decode", "decode lora", "prefill", "prefill lora")] == [0, 3, 0, 1]
    assert "decode lora CUDA graphs: steps 3, replayed 0, eager 3" in err


def test_verify_steps_with_an_adapter_count_under_decode_lora(
    adapters: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--lora-modules", f"sql={adapters['sql']}", "--lora-name", "sql", "--speculative-tokens", "2"]
    result, _ = _run(argv, capsys)
    rows = {(row["phase"], row["variant"]): row for row in result["graph_variants"]}  # type: ignore[union-attr]
    assert ("verify", "plain") not in rows  # no verify step went without an adapter
    assert rows[("decode", "lora")]["eager"] >= 1 and rows[("prefill", "lora")]["eager"] == 1
    speed = result["speed"]
    assert isinstance(speed, dict)
    assert speed["steps_eager"] == sum(row["eager"] for row in rows.values())
