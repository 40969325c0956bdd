"""Other engines' options and command lines (CG402, CG403): listed for review, rewritten only on an opt-in flag, never
in an engine's own definitions; reported from the ``ast`` tree alone, with the findings the libcst pass would give.

The fixtures ``engine_options`` and ``cli_flags_command_strings`` (listed as they are, rewritten with their switch)
show the rewrites; these tests hold what a fixture cannot: which findings each place gets, that reporting needs no
libcst parse, and the manual steps.
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import libcst as cst
import pytest
from libcst.codemod import CodemodContext

from cudagraph.migrate.command import main
from cudagraph.migrate.exports import load_exports
from cudagraph.migrate.options import RunOptions
from cudagraph.migrate.renames import RenameKind, load_renames
from cudagraph.migrate.rules import RULES, select_rules
from cudagraph.migrate.rules.base import ORIGINAL_KEY, REWRITE_ENGINE_OPTIONS_KEY, FindingKind, QuickView
from cudagraph.migrate.rules.cli_flags import REWRITE_ARGV_KEY
from cudagraph.migrate.source_migration import migrate_source

from .fixture_cases import FIXTURES, expected_text, fixture_texts

TABLE = load_renames()
OPTION_RULES = select_rules(["CG402", "CG403"])
LEGACY_OPTIONS = frozenset(TABLE.by_old(RenameKind.KWARG))
LEGACY_FLAGS = frozenset(TABLE.by_old(RenameKind.CLI_FLAG))
RL_DRIVER = Path(__file__).parent / "plugins" / "rl_driver" / "rl_plugin" / "driver.py"
TODO = "# TODO(cudagraph-migrate):"


def _listed(source: str, path: str = "plugin/module.py", **switches: bool) -> list[str]:
    result = migrate_source(source, path, RULES, TABLE, RunOptions(**switches))
    return [str(finding) for finding in result.findings if finding.kind is FindingKind.ARGV]


def test_each_place_that_passes_or_reads_an_engines_option_is_listed_with_its_canonical_spelling() -> None:
    listed = _listed((FIXTURES / "engine_options.in.py").read_text())
    assert listed == [
        "CG403 16: self.cuda_graph_max_bs: cudagraph.config spells it decode_cuda_graph_max_bs; "
        "--rewrite-engine-options rewrites it",
        "CG403 16: self.cuda_graph_max_bs: cudagraph.config spells it decode_cuda_graph_max_bs; "
        "--rewrite-engine-options rewrites it",
        "CG403 24: ServerArgs(...): cudagraph.config spells disable_cuda_graph= as decode_disable_cuda_graph= and "
        "prefill_disable_cuda_graph=, cuda_graph_max_bs= as decode_cuda_graph_max_bs=, piecewise_cuda_graph_compiler= "
        "as tc_piecewise_compiler=; --rewrite-engine-options rewrites them",
        "CG403 29: RolloutArgs(...): cudagraph.config spells enable_breakable_cuda_graph=True as prefill_cuda_graph_"
        'backend="breakable", cuda_graph_bs= as decode_cuda_graph_bs=; --rewrite-engine-options rewrites them',
        "CG403 30: sgl.Engine(...): cudagraph.config spells enforce_piecewise_cuda_graph=True as prefill_cuda_graph_"
        'backend="tc_piecewise", piecewise_cuda_graph_max_tokens= as prefill_cuda_graph_max_tokens=; '
        "--rewrite-engine-options rewrites them",
        "CG403 31: EngineWithDefaults(...): cudagraph.config spells disable_piecewise_cuda_graph= as "
        "prefill_disable_cuda_graph=, piecewise_cuda_graph_tokens= as prefill_cuda_graph_tokens=; "
        "--rewrite-engine-options rewrites them",
        "CG403 37: server_args.disable_cuda_graph: cudagraph.config has one option per phase: disable_cuda_graph -> "
        "decode_disable_cuda_graph and prefill_disable_cuda_graph; not one name for one name: move it by hand",
        "CG403 37: server_args.cuda_graph_max_bs: cudagraph.config spells it decode_cuda_graph_max_bs; "
        "--rewrite-engine-options rewrites it",
        "CG403 42: args.cuda_graph_bs: cudagraph.config spells it decode_cuda_graph_bs; "
        "--rewrite-engine-options rewrites it",
        "CG403 42: defaults.piecewise_cuda_graph_tokens: cudagraph.config spells it prefill_cuda_graph_tokens; "
        "--rewrite-engine-options rewrites it",
        "CG403 42: ServerArgs.cuda_graph_max_bs: cudagraph.config spells it decode_cuda_graph_max_bs; "
        "--rewrite-engine-options rewrites it",
        "CG403 47: server_args.enable_breakable_cuda_graph: cudagraph.config chooses by value: "
        'enable_breakable_cuda_graph -> prefill_cuda_graph_backend == "breakable"; not one name for one name: '
        "move it by hand",
        "CG403 47: server_args.piecewise_cuda_graph_compiler: cudagraph.config spells it tc_piecewise_compiler; "
        "--rewrite-engine-options rewrites it",
        "CG403 54: server_args.cuda_graph_max_bs: cudagraph.config spells it decode_cuda_graph_max_bs; the type of "
        "server_args was not proven (listed by its name): move it by hand",
        "CG403 57: self.server_args.piecewise_cuda_graph_max_tokens: cudagraph.config spells it "
        "prefill_cuda_graph_max_tokens; the type of self.server_args was not proven (listed by its name): "
        "move it by hand",
        "CG403 63: server_args.cuda_graph_bs: cudagraph.config spells it decode_cuda_graph_bs; the type of "
        "server_args was not proven (listed by its name): move it by hand",
    ]


def test_each_dict_carrying_sglangs_options_is_listed_with_its_canonical_spelling() -> None:
    listed = _listed((FIXTURES / "engine_option_dicts.in.py").read_text())
    rewrites = "--rewrite-engine-options rewrites"
    assert listed == [
        "CG403 6: dict(...): SGLang options in a dict; cudagraph.config spells disable_cuda_graph= as "
        f"decode_disable_cuda_graph= and prefill_disable_cuda_graph=, cuda_graph_max_bs= as decode_cuda_graph_max_bs=; "
        f"{rewrites} them",
        'CG403 10: {...}: SGLang options in a dict; cudagraph.config spells "disable_cuda_graph" as '
        '"decode_disable_cuda_graph" and "prefill_disable_cuda_graph", "cuda_graph_bs" as "decode_cuda_graph_bs"; '
        f"{rewrites} them",
        "CG403 15: ServerArgs(**args): args holds legacy option(s) cuda_graph_bs, disable_cuda_graph, listed where "
        "they are set",
        'CG403 19: kwargs.setdefault("disable_cuda_graph"): SGLang option key; cudagraph.config has one option per '
        'phase: "decode_disable_cuda_graph" and "prefill_disable_cuda_graph"; not one name for one name: move it by '
        "hand",
        'CG403 20: kwargs.setdefault("cuda_graph_max_bs"): SGLang option key; cudagraph.config spells it '
        f'"decode_cuda_graph_max_bs"; {rewrites} it',
        'CG403 21: kwargs["piecewise_cuda_graph_max_tokens"]: SGLang option key; cudagraph.config spells it '
        f'"prefill_cuda_graph_max_tokens"; {rewrites} it',
        'CG403 22: kwargs.get("enable_breakable_cuda_graph"): SGLang option key; cudagraph.config chooses by value: '
        '"enable_breakable_cuda_graph" -> "prefill_cuda_graph_backend" == "breakable"; not one name for one name: '
        "move it by hand",
        "CG403 23: kwargs.update(...): SGLang options in a dict; cudagraph.config spells enable_breakable_cuda_graph="
        'True as prefill_cuda_graph_backend="breakable", enforce_piecewise_cuda_graph=True as '
        f'prefill_cuda_graph_backend="tc_piecewise"; {rewrites} them',
        'CG403 24: {...}: SGLang options in a dict; cudagraph.config spells "enable_breakable_cuda_graph": True as '
        f'"prefill_cuda_graph_backend": "breakable"; {rewrites} them',
        "CG403 25: sglang.Engine(**ENGINE_KWARGS): ENGINE_KWARGS holds legacy option(s) cuda_graph_max_bs, "
        "disable_cuda_graph, listed where they are set",
        "CG403 25: sglang.Engine(**kwargs): kwargs holds legacy option(s) cuda_graph_max_bs, disable_cuda_graph, "
        "enable_breakable_cuda_graph, enforce_piecewise_cuda_graph, piecewise_cuda_graph_max_tokens, listed where "
        "they are set",
    ]


def test_what_the_opt_in_flag_cannot_rewrite_in_a_dict_stays_listed_or_marked() -> None:
    source = (FIXTURES / "engine_option_dicts.in.py").read_text()
    result = migrate_source(source, "plugin/module.py", RULES, TABLE, RunOptions(rewrite_engine_options=True))
    by_kind = {
        kind: [str(finding).split(": ")[0:2] for finding in result.findings if finding.kind is kind]
        for kind in (FindingKind.ARGV, FindingKind.TODO)
    }
    assert by_kind[FindingKind.ARGV] == [
        ["CG403 19", 'kwargs.setdefault("disable_cuda_graph")'],
        ["CG403 22", 'kwargs.get("enable_breakable_cuda_graph")'],
    ]
    assert by_kind[FindingKind.TODO] == [
        [
            "CG403 24",
            "enable_breakable_cuda_graph=flag is not a literal True/False; set prefill_cuda_graph_backend= by hand",
        ]
    ]


def test_dicts_in_a_file_that_imports_nothing_of_sglangs_are_not_listed() -> None:
    source = (FIXTURES / "engine_option_dicts.in.py").read_text()
    own = source.replace("import sglang\n", "import own_engine as sglang\n").replace(
        "from sglang.srt.entrypoints.http_server import ServerArgs", "from own_engine.args import ServerArgs"
    )
    assert "sglang." in own and "from sglang" not in own
    for rewrite in (False, True):
        result = migrate_source(own, "engine/module.py", RULES, TABLE, RunOptions(rewrite_engine_options=rewrite))
        # nothing listed for review or marked; its keyword calls are only named as not tied (-v, CG401)
        assert [finding for finding in result.findings if finding.kind is not FindingKind.SKIP] == []
        assert {finding.code for finding in result.findings} <= {"CG401"} and not result.changed


def test_this_programs_own_options_of_the_same_names_are_not_listed() -> None:
    source = (FIXTURES / "engine_options.in.py").read_text()
    own = source.index("@dataclasses.dataclass")
    first_own_line = source.count("\n", 0, own) + 1
    result = migrate_source(source, "plugin/module.py", RULES, TABLE, RunOptions(rewrite_engine_options=True))
    own_findings = [finding for finding in result.findings if finding.line >= first_own_line]
    # neither rewritten nor listed as SGLang's options; the fields of its config class are listed as maybe tied
    # (CG404: such fields are often rendered into SGLang's options), its keyword calls as not tied (-v)
    assert {(finding.kind, finding.code) for finding in own_findings} == {
        (FindingKind.MAYBE, "CG404"),
        (FindingKind.SKIP, "CG401"),
    }
    fields = [finding.line for finding in own_findings if finding.code == "CG404"]
    assert fields == [first_own_line + 4, first_own_line + 5]
    migrated = result.migrated.decode()
    assert migrated[migrated.index("@dataclasses.dataclass") :] == source[own:]


def test_what_the_opt_in_flag_cannot_rewrite_stays_listed() -> None:
    listed = _listed((FIXTURES / "engine_options.in.py").read_text(), rewrite_engine_options=True)
    assert [line.split(": ")[1] for line in listed] == [
        "server_args.disable_cuda_graph",
        "server_args.enable_breakable_cuda_graph",
        "server_args.cuda_graph_max_bs",
        "self.server_args.piecewise_cuda_graph_max_tokens",
        "server_args.cuda_graph_bs",
    ]
    assert all("move it by hand" in line for line in listed)


def test_command_like_strings_are_listed_wherever_they_go_and_messages_are_not() -> None:
    source = (FIXTURES / "cli_flags_command_strings.in.py").read_text()
    listed = _listed(source)
    assert listed == [
        "CG402 7: command string passes legacy flag(s) --enable-breakable-cuda-graph, "
        "--piecewise-cuda-graph-max-tokens=512",
        "CG402 16: command string passes legacy flag(s) --cuda-graph-max-bs, --disable-cuda-graph",
        "CG402 18: command string passes legacy flag(s) --disable-piecewise-cuda-graph, --disable-cuda-graph",
        "CG402 18: string passes legacy flag --cuda-graph-bs",
        "CG402 20: f-string passes legacy flag(s) --cuda-graph-max-bs: f-strings are listed, never rewritten",
        "CG402 25: string passes legacy flag --piecewise-cuda-graph-compiler",
        "CG402 27: string passes legacy flag --enforce-piecewise-cuda-graph",
        "CG402 29: command string passes legacy flag(s) --disable-cuda-graph=1, --cuda-graph-bs",
        "CG402 31: command string passes legacy flag(s) --piecewise-cuda-graph-tokens",
    ]
    messages = source.index("def messages")
    assert all(int(line.split()[1].rstrip(":")) < source.count("\n", 0, messages) + 1 for line in listed)


def test_what_rewrite_argv_cannot_rewrite_stays_listed() -> None:
    listed = _listed((FIXTURES / "cli_flags_command_strings.in.py").read_text(), rewrite_argv=True)
    assert listed == [
        "CG402 20: f-string passes legacy flag(s) --cuda-graph-max-bs: f-strings are listed, never rewritten",
        "CG402 27: string passes legacy flag --enforce-piecewise-cuda-graph, which becomes "
        "--prefill-cuda-graph-backend tc_piecewise: more than one argument",
        "CG402 29: command string passes legacy flag(s) --disable-cuda-graph=1 in a spelling with no rewrite; "
        "change it by hand",
        "CG402 31: command string passes legacy flag(s) --piecewise-cuda-graph-tokens: it holds escape sequences; "
        "change it by hand",
    ]


PLUGINS = Path(__file__).parent / "plugins"
OPTION_SOURCES = {
    **{
        name: text
        for name, text in fixture_texts().items()
        if name.startswith(("engine_options", "engine_option_dicts", "cli_flags", "argv_", "kwargs", "other_programs_"))
    },
    **{str(path.relative_to(PLUGINS.parent)): path.read_text() for path in sorted(PLUGINS.rglob("*.py"))},
}
"""The fixture inputs and expected outputs that pass options, and every plugin file, by name."""


@pytest.mark.parametrize("name", sorted(OPTION_SOURCES))
def test_the_ast_report_is_what_the_libcst_pass_finds(name: str) -> None:
    """Reporting reads the ``ast`` tree; the libcst pass (which runs where something is rewritten) must list the same
    places with the same words, so a flag changes only what is rewritten, never what is reported."""
    source = OPTION_SOURCES[name]
    exports = load_exports()
    view = QuickView(ast.parse(source), source, name, TABLE, rewrite_argv=False, imported=frozenset())
    for rule in OPTION_RULES:
        quick = rule.command.quick_findings(view)
        assert quick is not None
        tree = cst.parse_module(source)
        scratch = {REWRITE_ARGV_KEY: False, REWRITE_ENGINE_OPTIONS_KEY: False, ORIGINAL_KEY: (tree, source)}
        command = rule.command(CodemodContext(filename=name, scratch=scratch), TABLE, exports)
        assert command.transform_module(tree).code == source or command.comments_added
        assert command.edits == 0
        assert sorted(map(str, command.findings)) == sorted(map(str, quick)), rule.code


def test_listing_needs_no_libcst_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_parse(*args: object, **kwargs: object) -> cst.Module:
        raise AssertionError("parsed with libcst")

    monkeypatch.setattr(cst, "parse_module", no_parse)
    for name in ("engine_options", "cli_flags_command_strings"):
        source = (FIXTURES / f"{name}.in.py").read_text()
        result = migrate_source(source, "plugin/module.py", OPTION_RULES, TABLE, RunOptions())
        assert not result.changed and result.findings
    # with the flag, a file where nothing is tied to a legacy owner still needs no parse
    untied = "def f(args, factory):\n    return factory(cuda_graph_max_bs=4), args.server_args.cuda_graph_bs\n"
    result = migrate_source(untied, "plugin/module.py", OPTION_RULES, TABLE, RunOptions(rewrite_engine_options=True))
    assert [finding.line for finding in result.findings] == [2]


def test_a_value_known_only_at_run_time_is_a_manual_step_marked_once() -> None:
    source = (
        "from sglang.srt.server_args import ServerArgs\n"
        "\n"
        "\n"
        "def build(flag):\n"
        "    return ServerArgs(enable_breakable_cuda_graph=flag, cuda_graph_max_bs=8)\n"
    )
    options = RunOptions(rewrite_engine_options=True)
    first = migrate_source(source, "plugin/build.py", RULES, TABLE, options)
    todos = [str(finding) for finding in first.findings if finding.kind is FindingKind.TODO]
    assert todos == [
        "CG403 5: enable_breakable_cuda_graph=flag is not a literal True/False; set prefill_cuda_graph_backend= by hand"
    ]
    migrated = first.migrated.decode()
    assert (
        f"    {TODO} enable_breakable_cuda_graph=flag is not a literal True/False; set\n"
        "    #   prefill_cuda_graph_backend= by hand — see cudagraph-migrate --explain CG403\n"
        "    return ServerArgs(enable_breakable_cuda_graph=flag, decode_cuda_graph_max_bs=8)\n"
    ) in migrated
    again = migrate_source(migrated, "plugin/build.py", RULES, TABLE, options)
    assert again.migrated.decode() == migrated and again.edits == {}


ENGINE_DEFINITIONS = '''\
"""An engine's own options: its server arguments, its flags, its CLI."""

import argparse
import dataclasses

import click


@dataclasses.dataclass
class ServerArgs:
    cuda_graph_max_bs: int | None = None
    disable_cuda_graph: bool = dataclasses.field(default=False, metadata={"help": "--disable-cuda-graph: no graphs"})
    enable_breakable_cuda_graph: bool = False

    def __post_init__(self):
        if self.cuda_graph_max_bs is None:
            self.cuda_graph_max_bs = 8
        self.disable_cuda_graph = self.disable_cuda_graph or self.enable_breakable_cuda_graph

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser):
        parser.add_argument("--cuda-graph-max-bs", type=int, help="the largest batch graphed (see --cuda-graph-bs)")
        parser.add_argument("--disable-cuda-graph", action="store_true")


@click.command()
@click.option("--enable-breakable-cuda-graph", is_flag=True, help="prefill in segments")
def serve(enable_breakable_cuda_graph):
    return ServerArgs(enable_breakable_cuda_graph=enable_breakable_cuda_graph)
'''


@pytest.mark.parametrize("path", ["sglang/srt/server_args.py", "engine/options.py"])
@pytest.mark.parametrize("rewrite", [False, True], ids=["listing", "rewriting"])
def test_an_engines_own_definitions_are_never_rewritten_and_advised_only_in_sglangs_parser(
    path: str, rewrite: bool
) -> None:
    """Its options are not another engine's to list (CG403); its flag definitions are listed for review with the
    advice to use cudagraph.config.add_cli_args only where the parser is SGLang's (``ServerArgs.add_cli_args`` of
    ``sglang/srt/server_args.py``), else only with ``-v``; nothing is written into the file, not even a TODO comment,
    whatever the opt-in flags."""
    options = RunOptions(rewrite_argv=rewrite, rewrite_engine_options=rewrite)
    result = migrate_source(ENGINE_DEFINITIONS, path, RULES, TABLE, options)
    definitions = [(22, "--cuda-graph-max-bs"), (23, "--disable-cuda-graph"), (27, "--enable-breakable-cuda-graph")]
    advised = definitions[:2] if path.startswith("sglang/") else []
    assert [str(finding) for finding in result.findings if finding.kind is FindingKind.ARGV] == [
        f"CG402 {line}: defines legacy flag {flag}: define the flags with cudagraph.config.add_cli_args"
        for line, flag in advised
    ]
    definitions_left_alone = [
        str(finding) for finding in result.findings if finding.kind is FindingKind.SKIP and finding.code == "CG402"
    ]
    assert definitions_left_alone == [
        f"CG402 {line}: defines legacy flag {flag}: this program's own parser, not SGLang's ServerArgs.add_cli_args; "
        "left alone"
        for line, flag in definitions
        if (line, flag) not in advised
    ]
    assert [finding for finding in result.findings if finding.kind is FindingKind.TODO] == []
    assert result.edits == {}
    assert result.migrated.decode() == ENGINE_DEFINITIONS


def _option_places(source: str) -> set[int]:
    """Lines that pass or read a legacy option or flag, found with ``ast`` independently of the rules."""
    tree = ast.parse(source)
    docstrings = {
        id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }
    places = set()
    for node in ast.walk(tree):
        passes = isinstance(node, ast.Call) and any(keyword.arg in LEGACY_OPTIONS for keyword in node.keywords)
        reads = isinstance(node, ast.Attribute) and node.attr in LEGACY_OPTIONS
        flags = (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in docstrings
            and any(word.partition("=")[0] in LEGACY_FLAGS for word in node.value.split())
        )
        if passes or reads or flags:
            places.add(node.lineno)
    return places


def test_every_place_of_the_rl_driver_that_uses_sglangs_options_is_listed_and_none_rewritten() -> None:
    source = RL_DRIVER.read_text()
    result = migrate_source(source, "rl_plugin/driver.py", RULES, TABLE, RunOptions())
    assert not result.changed
    assert [finding for finding in result.findings if finding.kind is FindingKind.TODO] == []
    places = _option_places(source)
    assert places and places <= {finding.line for finding in result.findings if finding.kind is FindingKind.ARGV}


def test_the_opt_in_flags_on_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    switches = {"engine_options": "rewrite-engine-options", "cli_flags_command_strings": "rewrite-argv"}
    for name in switches:
        shutil.copy(FIXTURES / f"{name}.in.py", tmp_path / f"{name}.py")
    assert main([str(tmp_path), "--no-progress"]) == 0
    for name in switches:
        assert (tmp_path / f"{name}.py").read_bytes() == (FIXTURES / f"{name}.in.py").read_bytes()
    summary = capsys.readouterr().err
    assert "migrated: 0 edit(s)" in summary and "listed for review: 25 candidate(s)" in summary
    assert main([str(tmp_path), "--no-progress", "--rewrite-argv", "--rewrite-engine-options"]) == 0
    for name, switch in switches.items():
        assert (tmp_path / f"{name}.py").read_text() == expected_text(FIXTURES / f"{name}.in.py", switch)
    summary = capsys.readouterr().err
    assert "CG403  legacy-engine-options        16" in summary


@pytest.mark.parametrize(
    "import_line",
    [
        "from sglang.srt.server_args import ServerArgs",
        "from sglang.srt.entrypoints.http_server import ServerArgs",  # SGLang's own re-export
    ],
)
def test_a_server_args_call_is_listed_once_for_review_however_it_is_imported(import_line: str) -> None:
    """The keyword rule's not-tied listing and CG403 read the file's names the same way: a call of SGLang's
    ``ServerArgs`` is CG403's to list, never also CG401's as a callee not tied."""
    source = f'{import_line}\n\nargs = ServerArgs(model_path="m", disable_cuda_graph=True)\n'
    result = migrate_source(source, "driver/launch.py", RULES, TABLE, RunOptions())
    assert [(finding.kind, finding.code, finding.line) for finding in result.findings] == [
        (FindingKind.ARGV, "CG403", 3)
    ]
    assert not result.changed
