"""Results computed once per rename table, looked up by the table's identity.

A :class:`~cudagraph.migrate.renames.RenameTable` is a frozen dataclass: hashing it hashes every row, every time
(about 0.2 ms), so an ``lru_cache`` keyed on it costs more than many of the results it caches, and the prefilter and
the inventory ask for theirs on every file of a tree. :func:`per_table` caches by the table object instead (the run
loads one table, once per process); the cache holds the table itself, so its identity is never reused while the
entry lives.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable
from typing import ParamSpec, TypeVar

from .renames import RenameTable

__all__ = ["per_table"]

P = ParamSpec("P")
R = TypeVar("R")

_MOST_ENTRIES = 64
"""Entries kept per cached function (a test suite builds many small tables; a run uses one)."""


def per_table(function: Callable[P, R]) -> Callable[P, R]:
    """``function`` cached on its positional arguments, a :class:`RenameTable` among them by identity (the others by
    value: they must be hashable)."""
    cache: dict[tuple[Hashable, ...], tuple[tuple[object, ...], R]] = {}

    @functools.wraps(function)
    def cached(*args: P.args, **kwargs: P.kwargs) -> R:
        key = (*(id(arg) if isinstance(arg, RenameTable) else arg for arg in args), *sorted(kwargs.items()))
        found = cache.get(key)
        if found is not None:
            return found[1]
        result = function(*args, **kwargs)
        if len(cache) >= _MOST_ENTRIES:
            cache.clear()
        cache[key] = (args, result)  # the arguments stay alive with the entry: no table's id is reused meanwhile
        return result

    return cached
