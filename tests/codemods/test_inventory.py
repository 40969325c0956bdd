"""The inventory on hand-written cases: the issue's examples, each place and its outcome checked item by item."""

from __future__ import annotations

import importlib.util
import re
import shutil
import textwrap
from pathlib import Path

import pytest

from cudagraph.migrate.command import EXIT_CHANGES, EXIT_OK, main
from cudagraph.migrate.inventory import FileKind, inventory
from cudagraph.migrate.python_ast import parse_ast
from cudagraph.migrate.renames import load_renames
from cudagraph.migrate.spellings import SpellingForm, legacy_spellings
from cudagraph.migrate.todo_comments import TODO_MARKER

from .fixture_cases import expected_text

SPELLINGS = legacy_spellings(load_renames())
ACCOUNTED = re.compile(r"accounted: (\d+) of (\d+) legacy spellings \((\d+) rewritten, (\d+) TODOs, (\d+) listed\)")


def _accounted(err: str) -> tuple[int, ...]:
    found = ACCOUNTED.search(err)
    assert found is not None, err
    return tuple(map(int, found.groups()))


def _write(root: Path, name: str, text: str) -> Path:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def test_spellings_come_from_the_table_in_every_form() -> None:
    forms = {spelling.text: spelling.form for spelling in SPELLINGS}
    assert forms["sglang.srt.model_executor.cuda_graph_runner"] == SpellingForm.MODULE
    assert forms["sglang.srt.model_executor.cuda_graph_runner.CudaGraphRunner"] == SpellingForm.SYMBOL
    assert forms["CudaGraphRunner"] == SpellingForm.NAME
    assert forms["cuda_graph_max_bs"] == SpellingForm.OPTION
    assert forms["cuda-graph-max-bs"] == SpellingForm.OPTION_DASHED
    assert forms["--cuda-graph-max-bs"] == SpellingForm.FLAG
    assert "freeze_gc" not in forms  # moved under its own name: legacy only through its module path
    assert all(any(anchor in spelling.text for anchor in SPELLINGS.anchors) for spelling in SPELLINGS)


def test_the_issue_cases_are_each_one_item() -> None:
    source = textwrap.dedent(
        """\
        pick = lambda args: args.enforce_piecewise_cuda_graph
        flag = ("--cuda-graph-"
                "max-bs")
        path = "sglang.srt.model_executor." + "cuda_graph_runner"
        # graph_runner in a comment is not an item
        class Overlap:
            def capture_one_batch_size(self, bs, forward):
                return None
        from sglang.srt.distributed import is_in_piecewise_cuda_graph
        """
    )
    items = inventory(source, FileKind.PYTHON, SPELLINGS)
    assert [(item.line, item.column, item.spelling.text, item.context) for item in items] == [
        (1, 26, "enforce_piecewise_cuda_graph", "code"),
        (2, 10, "--cuda-graph-max-bs", "string assembled from pieces"),
        (4, 9, "sglang.srt.model_executor.cuda_graph_runner", "string assembled from pieces"),
        (7, 9, "capture_one_batch_size", "code"),
        (9, 36, "is_in_piecewise_cuda_graph", "code"),
    ]


def test_config_files_scripts_and_notebooks_are_listed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write(tmp_path, "deploy/values.yaml", "server:\n  cuda_graph_max_bs: 64  # cuda_graph_bs in a comment\n")
    _write(tmp_path, "deploy/launch.sh", "python -m sglang.launch_server --disable-cuda-graph --port 1\n")
    _write(tmp_path, "Dockerfile", 'CMD ["python", "-m", "sglang.launch_server", "--cuda-graph-bs", "8"]\n')
    _write(tmp_path, "serve.toml", "[server]\npiecewise_cuda_graph_max_tokens = 4096\n")
    notebook = '{"cells": [{"cell_type": "code", "source": ["args.cuda_graph_max_bs = 8\\n"]}]}'
    _write(tmp_path, "try.ipynb", notebook)
    assert main([str(tmp_path), "--check", "--no-progress"]) == EXIT_OK
    err = capsys.readouterr().err
    assert f"listed: {tmp_path / 'deploy/values.yaml'}:2:3: cuda_graph_max_bs -> decode_cuda_graph_max_bs" in err
    assert f"listed: {tmp_path / 'deploy/launch.sh'}:1:32: --disable-cuda-graph -> " in err
    assert f"listed: {tmp_path / 'Dockerfile'}:1:47: --cuda-graph-bs -> --decode-cuda-graph-bs" in err
    assert f"listed: {tmp_path / 'serve.toml'}:2:1: piecewise_cuda_graph_max_tokens" in err
    assert f"listed: {tmp_path / 'try.ipynb'}:1:51: cuda_graph_max_bs" in err
    assert _accounted(err) == (5, 5, 0, 0, 5)
    assert main([str(tmp_path), "--check", "--strict", "--no-progress"]) == EXIT_CHANGES


@pytest.mark.skipif(
    importlib.util.find_spec("ruamel") is None or importlib.util.find_spec("tomlkit") is None,
    reason="the config extra (ruamel.yaml, tomlkit) is not installed: pip install 'cudagraph-migrate[config]'",
)
def test_rewrite_config_renames_keys_in_place(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    values = _write(
        tmp_path, "values.yaml", "# ours\nserver:\n  cuda_graph_max_bs: 64  # graphed\n  disable_cuda_graph: true\n"
    )
    serve = _write(tmp_path, "serve.toml", "[server]\n# bs\ncuda-graph-bs = [1, 2]\nmodel = 'x'\n")
    data = _write(tmp_path, "serve.json", '{\n  "cuda_graph_max_bs": 64,\n  "model": "x"\n}\n')
    assert main([str(tmp_path), "--rewrite-config", "--no-progress"]) == EXIT_OK
    assert (
        values.read_text() == "# ours\nserver:\n  decode_cuda_graph_max_bs: 64  # graphed\n  disable_cuda_graph: true\n"
    )
    assert serve.read_text() == "[server]\n# bs\ndecode-cuda-graph-bs = [1, 2]\nmodel = 'x'\n"
    assert data.read_text() == '{\n  "decode_cuda_graph_max_bs": 64,\n  "model": "x"\n}\n'
    err = capsys.readouterr().err
    assert _accounted(err) == (4, 4, 3, 0, 1)  # disable_cuda_graph became two options: listed
    assert "disable_cuda_graph -> decode_disable_cuda_graph + prefill_disable_cuda_graph" in err
    assert main([str(tmp_path), "--rewrite-config", "--check", "--no-progress"]) == EXIT_OK  # a second run: nothing


def test_a_method_borrowed_through_the_class_object_keeps_the_legacy_class(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    draft = _write(
        tmp_path,
        "draft.py",
        """\
        from sglang.srt.model_executor.cuda_graph_runner import CudaGraphRunner


        class DraftRunner:
            def capture(self):
                CudaGraphRunner.capture(self)
        """,
    )
    assert main([str(draft), "--no-progress"]) == EXIT_OK
    written = draft.read_text()
    code = "\n".join(line for line in written.splitlines() if not line.lstrip().startswith("#"))
    assert "CudaGraphRunner.capture(self)" in code and "DecodeCudaGraphRunner" not in code
    assert f"{TODO_MARKER} kept on the legacy CudaGraphRunner: CudaGraphRunner.capture runs on class DraftRunner" in (
        " ".join(line.strip().removeprefix("#   ") for line in written.splitlines())
    )
    err = capsys.readouterr().err
    assert _accounted(err) == (3, 3, 0, 3, 0)


def test_a_derived_class_borrowing_its_base_method_moves_with_it(tmp_path: Path) -> None:
    runner = _write(
        tmp_path,
        "runner.py",
        """\
        from cudagraph.legacy.cuda_graph_runner import CudaGraphRunner


        class Runner(CudaGraphRunner):
            def capture(self):
                return super(CudaGraphRunner, self).capture()
        """,
    )
    assert main([str(runner), "--no-progress"]) == EXIT_OK
    assert "super(DecodeCudaGraphRunner, self).capture()" in runner.read_text()


def test_a_file_only_newer_pythons_parse_is_migrated(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = Path(__file__).parent / "newer_grammar" / "py312_syntax.in.py"
    target = tmp_path / "runner_types.py"
    shutil.copy(source, target)
    parse_ast(source.read_text())  # readable whatever Python runs this
    assert main([str(target), "--no-progress"]) == EXIT_OK
    err = capsys.readouterr().err
    assert "does not parse" not in err
    assert target.read_text() == expected_text(source)
    accounted = _accounted(err)
    assert accounted[0] == accounted[1] and accounted[2] > 0


def test_a_plugin_hook_named_like_the_legacy_runner_method_is_listed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """SGLang 0.5.13's batch-overlap plugin: the legacy runner calls its ``capture_one_batch_size``, the new one never
    will; and a renamed name imported through a re-export path the table does not list."""
    plugin = _write(
        tmp_path,
        "two_batch_overlap.py",
        """\
        from sglang.srt.distributed import is_in_piecewise_cuda_graph
        from sglang.srt.model_executor.forward_batch_info import ForwardMode


        class TboCudaGraphRunnerPlugin:
            def capture_one_batch_size(self, batch, num_tokens: int):
                return is_in_piecewise_cuda_graph()
        """,
    )
    assert main([str(plugin), "--check", "--no-progress"]) == EXIT_OK
    err = capsys.readouterr().err
    assert f"listed: {plugin}:6:9: capture_one_batch_size -> capture_bucket (name in code): a method named like" in err
    assert f"listed: {plugin}:1:36: is_in_piecewise_cuda_graph -> is_in_tc_piecewise_cuda_graph" in err
    assert f"listed: {plugin}:7:16: is_in_piecewise_cuda_graph" in err
    assert _accounted(err) == (3, 3, 0, 0, 3)
    assert main([str(plugin), "--check", "--strict", "--no-progress"]) == EXIT_CHANGES


@pytest.mark.skipif(
    importlib.util.find_spec("ruamel") is None,
    reason="the config extra (ruamel.yaml) is not installed: pip install 'cudagraph-migrate[config]'",
)
def test_rewrite_config_with_check_and_diff_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    values = _write(tmp_path, "values.yaml", "server:\n  cuda_graph_max_bs: 64\n")
    assert main([str(tmp_path), "--rewrite-config", "--check", "--no-progress"]) == EXIT_CHANGES
    assert main([str(tmp_path), "--rewrite-config", "--diff", "--no-progress"]) == EXIT_CHANGES
    assert "+  decode_cuda_graph_max_bs: 64" in capsys.readouterr().out
    assert values.read_text() == "server:\n  cuda_graph_max_bs: 64\n"
