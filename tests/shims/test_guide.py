"""The migration guide's generated table lists every row of the rename table and stays in step with it."""

from __future__ import annotations

from pathlib import Path

from cudagraph.legacy.guide import BEGIN, END, main, render_migration_table, splice
from cudagraph.migrate.renames import load_renames

GUIDE = Path(__file__).resolve().parents[2] / "refactor" / "migration-guide.md"


def test_committed_guide_is_up_to_date() -> None:
    assert main(["--check", str(GUIDE)]) == 0


def test_every_row_is_listed_with_its_removal_version() -> None:
    rendered = render_migration_table()
    for row in load_renames():
        line = next(line for line in rendered.splitlines() if line.startswith(f"| `{row.old}` |"))
        assert f"`{row.new}`" in line
        assert f"| {row.removed_in} |" in line


def test_a_stale_guide_fails_the_check_and_is_regenerated(tmp_path: Path) -> None:
    guide = tmp_path / "guide.md"
    guide.write_text(f"# Guide\n\nprose kept\n\n{BEGIN}\n| stale |\n{END}\n\nafter\n")
    assert main(["--check", str(guide)]) == 1
    assert main([str(guide)]) == 0
    text = guide.read_text()
    assert "| stale |" not in text
    assert text.startswith("# Guide\n\nprose kept\n\n")
    assert text.endswith("after\n")
    assert main(["--check", str(guide)]) == 0


def test_splice_appends_when_the_guide_has_no_generated_section() -> None:
    assert splice("# Guide\n", "TABLE\n") == "# Guide\n\nTABLE\n"


def test_an_installed_package_prints_the_table_and_writes_nothing(monkeypatch, capsys, tmp_path: Path) -> None:
    import cudagraph.legacy.guide as guide

    monkeypatch.setattr(guide, "default_guide_path", lambda: None)
    monkeypatch.chdir(tmp_path)
    assert main([]) == 0
    assert capsys.readouterr().out == render_migration_table()
    assert list(tmp_path.iterdir()) == []


def test_the_checkout_guide_is_the_default_only_in_a_checkout() -> None:
    import cudagraph.legacy.guide as guide

    assert guide.default_guide_path() == GUIDE
