"""Run-wide switches every worker needs, in one frozen dataclass (picklable, so it crosses process boundaries)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RunOptions"]


@dataclass(frozen=True)
class RunOptions:
    """What a migration run may rewrite beyond imports and the legacy API itself."""

    rewrite_argv: bool = False
    """Rewrite legacy flags in argv lists and command strings (other programs' command lines); off by default."""
    rewrite_engine_options: bool = False
    """Rewrite legacy options of other engines' Python APIs (``ServerArgs(...)``/``Engine(...)`` keywords, reads of
    ``server_args.<legacy option>``); off by default, since those engines define the options they accept."""
    reexports: tuple[tuple[str, str], ...] = ()
    """``project.module.Name -> new qualified name`` for legacy names the project re-exports (see ``reexports``)."""
