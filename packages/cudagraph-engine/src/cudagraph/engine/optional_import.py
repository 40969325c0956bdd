"""One way to import the part of the engine that sits on an optional package (FlashInfer, Triton): the attention
backends' and the kernel sets' registries both load their optional rows through ``import_optional``, so a missing
package is one error naming it, and any other import failure propagates unchanged."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType

__all__ = ["import_optional"]


def import_optional(
    module_name: str,
    package: str | None,
    *,
    provided_by: tuple[str, ...],
    unavailable: Callable[[str], Exception],
) -> ModuleType:
    """``importlib.import_module(module_name, package)``; a ``ModuleNotFoundError`` for one of the top-level modules
    ``provided_by`` (the optional package and what it needs) raises ``unavailable(missing_module_name)`` instead,
    without the import's traceback. A missing module of anything else is a bug and propagates as it is.

    Example:
        >>> import_optional(
        ...     "surely_not_installed.kernels", None, provided_by=("surely_not_installed",), unavailable=RuntimeError
        ... )
        Traceback (most recent call last):
        RuntimeError: surely_not_installed
    """
    try:
        return importlib.import_module(module_name, package)
    except ModuleNotFoundError as error:
        if error.name is None or error.name.partition(".")[0] not in provided_by:
            raise
        raise unavailable(error.name) from None
