"""TODO comments: a long one is wrapped over several comment lines, and a second run neither duplicates nor removes
it, whichever form (wrapped at any width, or on one line as earlier versions wrote it) is already in the file."""

from __future__ import annotations

import libcst as cst
from hypothesis import given
from hypothesis import strategies as st

from cudagraph.migrate.renames import load_renames
from cudagraph.migrate.rules import RULES
from cudagraph.migrate.rules.base import FindingKind
from cudagraph.migrate.source_migration import migrate_source
from cudagraph.migrate.todo_comments import (
    CONTINUATION,
    TODO_MARKER,
    WIDTH,
    todo_comments_in,
    todo_lines,
    todo_text,
    todos_in,
    with_todo_comments,
)

LONG = todo_text(
    "kept on the legacy CudaGraphRunner: DecodeCudaGraphRunner(model_runner, config, *, backend=..., "
    "show_progress=..., num_warmups=..., capture_barrier=...) does not take this call: missing required argument "
    "'config'; the members graphs, capture_bs, output_buffers and recapture_if_needed are missing too",
    "CG101",
)
STAR_IMPORT = "from sglang.srt.model_executor.cuda_graph_runner import *  # noqa: F403\n\nx = 1\n"
"""A file whose first statement gets a TODO (libcst reads comments above it as the module's header)."""
INDENTED = (
    "from cudagraph.config import resolve\n\n\ndef configs(flag):\n"
    "    return resolve(enable_breakable_cuda_graph=flag)\n"
)
"""A file with a TODO inside a function."""


def _joined(lines: list[str]) -> str:
    return " ".join([lines[0], *(line.removeprefix(CONTINUATION) for line in lines[1:])])


def _statement(comments: list[str]) -> cst.SimpleStatementLine:
    code = "y = 0\n" + "".join(f"{comment}\n" for comment in comments) + "x = 1\n"
    statement = cst.parse_module(code).body[1]  # not the first: comments above that are the module's header
    assert isinstance(statement, cst.SimpleStatementLine)
    return statement


def test_a_long_todo_is_wrapped_at_the_width() -> None:
    lines = todo_lines(LONG)
    assert len(lines) > 2
    assert lines[0].startswith(TODO_MARKER)
    assert all(line.startswith(CONTINUATION) and line[len(CONTINUATION)] != " " for line in lines[1:])
    assert all(len(line) <= WIDTH for line in lines)
    assert _joined(lines) == LONG
    assert lines[-1].endswith(" cudagraph-migrate --explain CG101")  # the command is never split


def test_a_short_todo_stays_on_one_line() -> None:
    text = todo_text("star import from a.b", "CG101")
    assert len(text) <= WIDTH
    assert todo_lines(text) == [text]


words = st.text(st.characters(codec="utf-8", exclude_categories=("Zs", "Zl", "Zp", "Cc", "Cs")), min_size=1)


@given(st.lists(st.one_of(words, st.sampled_from(["--cuda-graph-max-bs", "a" * 130, "—", "x.y.z"])), min_size=1))
def test_wrapping_keeps_every_word_and_reads_back(message: list[str]) -> None:
    text = todo_text(" ".join(message), "CG201")
    lines = todo_lines(text)
    assert _joined(lines) == text
    assert all(len(line) <= WIDTH or " " not in line.removeprefix(CONTINUATION).strip() for line in lines[1:])
    assert text in todos_in(lines)
    indented = "if x:\n" + "".join(f"    {line}\n" for line in lines) + "    pass\n"
    assert todo_comments_in(indented) == [text]


def test_a_wrapped_todo_already_above_is_not_written_again() -> None:
    statement = _statement(todo_lines(LONG))
    same, added = with_todo_comments(statement, [LONG])
    assert added == 0 and same is statement


def test_a_todo_wrapped_at_another_width_or_on_one_line_is_recognised() -> None:
    words = LONG.removeprefix("# ").split()
    narrow = ["# " + " ".join(words[:6]), *(CONTINUATION + " ".join(words[i : i + 6]) for i in range(6, len(words), 6))]
    for present in (narrow, [LONG]):
        assert with_todo_comments(_statement(present), [LONG])[1] == 0


def test_a_todo_an_earlier_version_wrote_with_a_guide_anchor_is_recognised() -> None:
    """Earlier versions ended a TODO with ``— see migration-guide.md#<section>``: it is the same TODO."""
    earlier = LONG.replace(
        "— see cudagraph-migrate --explain CG101", "— see migration-guide.md#calls-the-new-api-does-not-accept"
    )
    assert earlier != LONG
    for present in (todo_lines(earlier), [earlier]):
        assert with_todo_comments(_statement(present), [LONG])[1] == 0


def test_the_command_closing_a_todo_is_never_split() -> None:
    for width in range(20, 90):
        text = todo_text("x" * width, "CG102")
        assert todo_lines(text)[-1].endswith("cudagraph-migrate --explain CG102"), width


def test_a_comment_of_the_users_below_a_todo_does_not_hide_it() -> None:
    statement = _statement([*todo_lines(LONG), f"{CONTINUATION}an indented note of the user's own"])
    assert with_todo_comments(statement, [LONG])[1] == 0


def test_only_the_missing_todo_is_added_wrapped() -> None:
    short = todo_text("short", "CG101")
    marked, added = with_todo_comments(_statement([short]), [short, LONG])
    assert added == 1
    assert [line.comment.value for line in marked.leading_lines if line.comment] == [short, *todo_lines(LONG)]


def test_a_migrated_file_with_wrapped_todos_migrates_to_itself() -> None:
    for source in (STAR_IMPORT, INDENTED):
        once = _migrated(source)
        assert once.count(TODO_MARKER) == 1
        assert any(line.lstrip().startswith(CONTINUATION) for line in once.splitlines())  # it is wrapped
        assert _migrated(once) == once


def test_a_file_with_one_line_todos_of_an_earlier_version_gets_no_second_one() -> None:
    wrapped = _migrated(STAR_IMPORT)
    (comment,) = todo_comments_in(wrapped)
    one_line = wrapped.replace("\n".join(todo_lines(comment)), comment)
    assert one_line != wrapped and one_line.count(TODO_MARKER) == 1
    assert _migrated(one_line) == one_line


def test_each_todo_finding_is_one_wrapped_comment_in_the_file() -> None:
    result = migrate_source(STAR_IMPORT, "pkg/module.py", RULES, load_renames())
    todos = [finding for finding in result.findings if finding.kind is FindingKind.TODO]
    comments = todo_comments_in(result.migrated.decode())
    assert len(todos) == len(comments) == 1
    assert " ".join(todos[0].message.split()) in comments[0]


def _migrated(text: str) -> str:
    return migrate_source(text, "pkg/module.py", RULES, load_renames()).migrated.decode()
