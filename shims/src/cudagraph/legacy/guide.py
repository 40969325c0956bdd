"""Render the migration guide's table (every legacy name, its replacement, when it goes) from the rename table.

``python -m cudagraph.legacy.guide [PATH]`` rewrites the generated section of ``refactor/migration-guide.md`` (or of
PATH); ``--check`` exits 1 when that section is out of date, so CI can keep the guide and the table in step.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cudagraph.config import Rename, RenameKind, load_renames, renames_path

BEGIN = "<!-- BEGIN GENERATED TABLE: python -m cudagraph.legacy.guide -->"
END = "<!-- END GENERATED TABLE -->"

_KIND_TITLES = {
    RenameKind.MODULE: "Modules",
    RenameKind.SYMBOL: "Imported names",
    RenameKind.ATTRIBUTE: "Attributes",
    RenameKind.METHOD: "Methods",
    RenameKind.ENUM_MEMBER: "Enum members",
    RenameKind.CONFIG_STRING: "Config strings",
    RenameKind.KWARG: "Server-argument keywords",
    RenameKind.CLI_FLAG: "Command-line flags",
}


def _replacement(row: Rename) -> str:
    targets = ", ".join(f"`{target}`" for target in row.targets)
    return f"{targets} = `{row.value}`" if row.value is not None else targets


def render_migration_table() -> str:
    """The generated Markdown: one table per kind of rename, in the table's order."""
    table = load_renames()
    sections = [BEGIN]
    for kind, title in _KIND_TITLES.items():
        rows = table.of_kind(kind)
        if not rows:
            continue
        sections.append(f"\n### {title}\n")
        sections.append("| legacy | replacement | deprecated in | removed in | note |")
        sections.append("|---|---|---|---|---|")
        sections.extend(
            f"| `{row.old}` | {_replacement(row)} | {row.deprecated_in} | {row.removed_in} | {row.note} |"
            for row in rows
        )
    sections.append(END)
    return "\n".join(sections) + "\n"


def splice(document: str, generated: str) -> str:
    """``document`` with its generated section replaced by ``generated`` (appended when it has none)."""
    if BEGIN not in document:
        return document.rstrip("\n") + "\n\n" + generated
    head, _, rest = document.partition(BEGIN)
    _, found_end, tail = rest.partition(END)
    if not found_end:
        raise ValueError(f"the guide has {BEGIN!r} but no {END!r}; restore the end marker")
    return head + generated.rstrip("\n") + tail


def default_guide_path() -> Path | None:
    """``refactor/migration-guide.md`` of the source checkout this runs from, or None for an installed package.

    An installed package never writes beside its own files: with no path given, the table goes to stdout.
    """
    table = renames_path()
    guide = table.parent / "migration-guide.md"
    return guide if table.parent.name == "refactor" and guide.is_file() else None


def main(argv: list[str] | None = None) -> int:
    """Print the generated table, or write (with ``--check``, verify) it into a guide."""
    parser = argparse.ArgumentParser(prog="python -m cudagraph.legacy.guide", description=__doc__)
    parser.add_argument(
        "path",
        nargs="?",
        type=Path,
        help="the guide to update (default: refactor/migration-guide.md in a source checkout; else print the table)",
    )
    parser.add_argument("--check", action="store_true", help="exit 1 if the guide's table is out of date")
    args = parser.parse_args(argv)
    path: Path | None = args.path or default_guide_path()
    if path is None:
        if args.check:
            parser.error("--check needs the guide's path outside a source checkout")
        sys.stdout.write(render_migration_table())
        return 0
    current = path.read_text(encoding="utf-8") if path.exists() else ""
    updated = splice(current, render_migration_table())
    if args.check:
        if updated != current:
            print(f"{path}: the generated table is out of date; run python -m cudagraph.legacy.guide", file=sys.stderr)
            return 1
        return 0
    if updated != current:
        path.write_text(updated, encoding="utf-8")
        print(f"{path}: table regenerated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
