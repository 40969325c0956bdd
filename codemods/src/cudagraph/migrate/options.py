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
    move_shared_state: bool = False
    """Move names that share state with a legacy engine's graph runner (its capture flag, graph pool, forward
    context) off that engine's modules too: right only once the engine's runners are cudagraph's."""
    reexports: tuple[tuple[str, str], ...] = ()
    """``project.module.Name -> new qualified name`` for legacy names the project re-exports (see ``reexports``)."""
