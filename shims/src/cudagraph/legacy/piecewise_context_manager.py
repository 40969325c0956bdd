"""Deprecated: ``cudagraph.legacy.piecewise_context_manager``.

Every name here forwards to its new home (see ``refactor/renames.toml``).

Each use warns once (`DeprecationWarning`) at the line that used it; run `cudagraph-migrate` to move code over.
"""

from ._module_shim import module_shim

__getattr__, __dir__ = module_shim(__name__)
