"""Property: ``cudagraph-migrate`` accounts for every legacy spelling it meets, wherever it stands.

Random trees place legacy spellings (every spelling the rename table gives a legacy name, derived here from the
table's rows on their own) in random syntactic contexts of Python files (calls, attributes on any receiver, lambdas,
comprehensions, decorators, f-strings, default values, class bodies, dict keys, keywords, imports, literals split
into adjacent or ``+``-joined pieces) and in config files, scripts and notebooks (YAML/TOML/JSON keys, argv lists,
shell arguments, notebook code cells). After a writing run:

- the inventory holds exactly the placed spellings, at the places they were put (nothing missed, nothing invented);
- each item has one outcome, and ``accounted: N of N``;
- what the report leaves (a TODO or a listed item) is exactly what the written files still hold, counted by an
  oracle of its own (a longest-match scan of each output's non-comment text), and every TODO item stands in a file
  that has a TODO comment.

``nox -s property -- --hypothesis-profile=deep`` runs 5,000 examples.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst
from hypothesis import given
from hypothesis import strategies as st

from cudagraph.migrate.batch_run import MigrationOptions, migrate_files
from cudagraph.migrate.inventory import Outcome
from cudagraph.migrate.renames import RenameKind, load_renames
from cudagraph.migrate.rules import RULES
from cudagraph.migrate.todo_comments import TODO_MARKER

TABLE = load_renames()
SHIPPED = {row.old for row in TABLE.of_kind(RenameKind.MODULE) if row.still_shipped}
MODULES = sorted(row.old for row in TABLE.of_kind(RenameKind.MODULE) if not row.still_shipped)
SYMBOLS = [row for row in TABLE.of_kind(RenameKind.SYMBOL) if row.old_module not in SHIPPED]
NAMES = sorted(
    {row.old_name for row in SYMBOLS if row.old_name != row.new_name}
    | {
        row.old
        for row in TABLE.of_kind(
            RenameKind.ATTRIBUTE, RenameKind.METHOD, RenameKind.ENUM_MEMBER, RenameKind.CONFIG_STRING, RenameKind.KWARG
        )
    }
)
"""Spellings that are identifiers."""
DASHED = sorted({row.old.replace("_", "-") for row in TABLE.of_kind(RenameKind.KWARG)})
FLAGS = sorted(row.old for row in TABLE.of_kind(RenameKind.CLI_FLAG))
ANY_TEXT = sorted({*MODULES, *(row.old for row in SYMBOLS), *NAMES, *DASHED, *FLAGS})
"""Every spelling, as a string's content may hold it."""
ORACLE = re.compile(
    r"(?<![\w-])(?:" + "|".join(re.escape(text) for text in sorted(ANY_TEXT, key=len, reverse=True)) + r")(?![\w-])"
)
"""Longest match first: a symbol's path is one occurrence, not its module's plus its name."""

OPTIONS = MigrationOptions(rule_codes=tuple(rule.code for rule in RULES))
CHECK_OPTIONS = MigrationOptions(rule_codes=OPTIONS.rule_codes, write=False)


@dataclass
class Draft:
    """A file being written, with where each spelling was put (offsets into ``text``)."""

    text: str = ""
    placed: list[tuple[int, str]] = field(default_factory=list)

    def add(self, template: str, spelling: str, at: int | None = None) -> None:
        """Append ``template`` with ``{s}`` replaced by ``spelling`` (placed where ``{s}`` stood, or at ``at``)."""
        where = template.index("{s}")
        offset = len(self.text) + (where if at is None else at)
        self.text += template.replace("{s}", spelling)
        self.placed.append((offset, spelling))


NAME_CONTEXTS = (
    "result = handler({s})\n",
    "value = receiver.{s}\n",
    "receiver.{s}(1, key=2)\n",
    "pick = lambda args: args.{s}\n",
    "values = [item.{s} for item in items]\n",
    "values = {k: v.{s} for k, v in pairs}\n",
    "@registry.{s}\ndef hooked():\n    return None\n",
    'text = f"{item.{s}} done"\n',
    "def configure(option={s}):\n    return option\n",
    "class Holder:\n    {s} = 1\n",
    "class Holder(Base):\n    def step(self):\n        return self.{s}\n",
    "launch({s}=1)\n",
    "with receiver.{s}() as handle:\n    pass\n",
    "if state.{s}:\n    pass\n",
)
STRING_CONTEXTS = (
    'NOTE = "uses {s} here"\n',
    'text = f"{prefix} {s}"\n',
    'def configure(option="{s}"):\n    return option\n',
    'options = {"{s}": 1}\n',
    'getattr(receiver, "{s}", None)\n',
    'command = ["python", "-m", "sglang.launch_server", "{s}", "8"]\n',
    "payload = '''\n{s}\n'''\n",
)
HEADERS = ("", "from sglang.srt.server_args import ServerArgs\n", "import sglang\n", "import os\n")


@st.composite
def python_statement(draw: st.DrawFn, draft: Draft) -> None:
    shape = draw(st.sampled_from(("name", "string", "split", "joined", "import")))
    if shape == "name":
        draft.add(draw(st.sampled_from(NAME_CONTEXTS)), draw(st.sampled_from(NAMES)))
    elif shape == "string":
        draft.add(draw(st.sampled_from(STRING_CONTEXTS)), draw(st.sampled_from(ANY_TEXT)))
    elif shape in ("split", "joined"):
        spelling = draw(st.sampled_from(ANY_TEXT))
        cut = draw(st.integers(1, len(spelling) - 1))
        joint = '"\n    "' if shape == "split" else '" + "'
        template = 'piece = ("{s}")\n'
        draft.add(template, spelling[:cut] + joint + spelling[cut:])
        draft.placed[-1] = (draft.placed[-1][0], spelling)
    else:
        row = draw(st.sampled_from(SYMBOLS))
        module = row.old_module
        start = len(draft.text) + len("from ")
        draft.text += f"from {module} import {row.old_name}\n"
        draft.placed.append((start, module))
        if row.old_name != row.new_name:
            draft.placed.append((start + len(module) + len(" import "), row.old_name))


@st.composite
def python_file(draw: st.DrawFn) -> Draft:
    draft = Draft(draw(st.sampled_from(HEADERS)))
    for _ in range(draw(st.integers(1, 4))):
        draw(python_statement(draft))
    return draft


@dataclass(frozen=True)
class ConfigKind:
    """One kind of config file: its name, its opening lines, and the line a spelling stands in."""

    filename: str
    header: str
    template: str
    """One line with ``{s}`` where the spelling goes."""
    takes_flag: bool
    """The spelling is a dashed flag (an argv entry); otherwise an option name (a key)."""


CONFIG_KINDS = {
    "yaml": ConfigKind("values.yaml", "# server options\n", "server:\n  {s}: 64\n", takes_flag=False),
    "k8s": ConfigKind(
        "deployment.yaml",
        "spec:\n  containers:\n    - args:\n        - --model-path\n",
        '        - "{s}"\n',
        takes_flag=True,
    ),
    "toml": ConfigKind("serve.toml", "[server]\n", "{s} = 64  # graphed\n", takes_flag=False),
    "json": ConfigKind("serve.json", "{\n", '  "{s}": 64\n}\n', takes_flag=False),
    "sh": ConfigKind(
        "launch.sh", "#!/bin/sh\n", "python -m sglang.launch_server {s} 8 \\\n  --port 30000\n", takes_flag=True
    ),
    "Dockerfile": ConfigKind(
        "Dockerfile",
        "FROM python:3.11\n",
        'CMD ["python", "-m", "sglang.launch_server", "{s}", "8"]\n',
        takes_flag=True,
    ),
}


@st.composite
def config_file(draw: st.DrawFn) -> tuple[str, Draft]:
    kind = CONFIG_KINDS[draw(st.sampled_from(("yaml", "toml", "json", "sh", "Dockerfile", "k8s")))]
    option = draw(st.sampled_from(sorted({*DASHED, *(row.old for row in TABLE.of_kind(RenameKind.KWARG))})))
    flag = draw(st.sampled_from(FLAGS))
    draft = Draft(kind.header)
    draft.add(kind.template, flag if kind.takes_flag else option)
    return kind.filename, draft


def notebook(draft: Draft) -> tuple[str, list[tuple[int, int, str]]]:
    """The Python ``draft`` as a notebook's one code cell, and where each spelling stands in the notebook's text."""
    lines = draft.text.splitlines(keepends=True)
    text = json.dumps({"cells": [{"cell_type": "code", "source": lines}], "nbformat": 4}, indent=1)
    located = []
    cursor = 0
    for line in lines:
        found = text.index(json.dumps(line)[1:-1], cursor)
        located.append(found)
        cursor = found + len(json.dumps(line)) - 2
    line_offsets = [0]
    for line in lines:
        line_offsets.append(line_offsets[-1] + len(line))
    places = []
    for offset, spelling in draft.placed:
        number = max(i for i, start in enumerate(line_offsets[:-1]) if start <= offset)
        prefix = json.dumps(lines[number][: offset - line_offsets[number]])[1:-1]
        places.append((*_line_column(text, located[number] + len(prefix)), spelling))
    return text, places


def _line_column(text: str, offset: int) -> tuple[int, int]:
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1


def _left_in(text: str, python: bool) -> Counter[str]:
    """The legacy spellings ``text`` holds outside comments (the oracle)."""
    kept = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#") and (python or not stripped.startswith("#!")):
            continue
        kept.append(line.split("  #")[0] if not python else line)
    joined = re.sub(r'"\s*\+?\s*"', "", "\n".join(kept)) if python else "\n".join(kept)  # the split literals
    return Counter(match.group() for match in ORACLE.finditer(joined))


@given(
    st.lists(python_file(), min_size=1, max_size=2),
    st.lists(config_file(), max_size=2),
    st.booleans(),
)
def test_every_legacy_spelling_is_accounted_for(pythons: list[Draft], configs: list, as_notebook: bool) -> None:
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        expected: dict[str, set[tuple[int, int, str]]] = {}
        python_paths = set()
        for index, draft in enumerate(pythons):
            if as_notebook and index == 0:
                path = root / "analysis.ipynb"
                text, places = notebook(draft)
                path.write_text(text)
                expected[str(path)] = set(places)
                continue
            path = root / f"module_{index}.py"
            path.write_text(draft.text)
            python_paths.add(str(path))
            expected[str(path)] = {(*_line_column(draft.text, offset), text) for offset, text in draft.placed}
        for index, (name, draft) in enumerate(configs):
            path = root / f"c{index}" / name
            path.parent.mkdir()
            path.write_text(draft.text)
            expected[str(path)] = {(*_line_column(draft.text, offset), text) for offset, text in draft.placed}

        paths = sorted(Path(path) for path in expected)
        checked = migrate_files(paths, CHECK_OPTIONS)  # places as read
        for file in [*checked.files, *checked.other_files]:
            found = {(a.item.line, a.item.column, a.item.spelling.text) for a in file.inventory}
            assert found == expected[file.path], (file.path, Path(file.path).read_text())

        report = migrate_files(paths, OPTIONS)  # the same outcomes, written

        reports = {file.path: file for file in [*report.files, *report.other_files]}
        assert set(reports) == set(expected)
        total = 0
        for path, file in reports.items():
            assert len(file.inventory) == len(expected[path])
            total += len(file.inventory)
            if file.status == "failed":
                assert all(a.outcome is Outcome.LISTED for a in file.inventory), file.error
                continue
            output = Path(path).read_text()
            left = Counter(a.item.spelling.text for a in file.inventory if a.outcome is not Outcome.REWRITTEN)
            if path.endswith(".ipynb"):
                cells = json.loads(output)["cells"]
                output = "".join(line for cell in cells for line in cell["source"])
            assert left == _left_in(output, path in python_paths or path.endswith(".ipynb")), (path, output)
            if any(a.outcome is Outcome.TODO for a in file.inventory):
                assert TODO_MARKER in output
            if path in python_paths and file.status == "changed":
                cst.parse_module(output)
        accounting = report.accounting()
        assert accounting.total == total
        assert accounting.accounted == accounting.total
        assert accounting.line().startswith(f"accounted: {total} of {total} legacy spellings")
