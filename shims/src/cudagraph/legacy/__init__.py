"""Legacy module paths and names, kept importable until the removal version in ``refactor/renames.toml``.

``cudagraph.legacy.cuda_graph_runner``, ``.piecewise_context_manager``, ``.breakable_cuda_graph`` and
``.server_args`` serve the table's symbol rows: the object returned is the new object itself, and each use warns once
at the user's line. ``LegacyAliasesMixin`` / ``install_legacy_aliases`` give legacy attribute and method names to the
new classes that own them (a row's ``owners``), and to no other class. Nothing here is hand-listed: the rename table
drives it all.
"""

from ._aliases import LegacyAliasesMixin, install_legacy_aliases, installed_legacy_aliases, remove_legacy_aliases
from ._schedule import LEGACY_MODULES, ShimEntry, shim_entries
from ._warnings import forget_warned_sites

__version__ = "0.1.0"

__all__ = [
    "LEGACY_MODULES",
    "LegacyAliasesMixin",
    "ShimEntry",
    "__version__",
    "forget_warned_sites",
    "install_legacy_aliases",
    "installed_legacy_aliases",
    "remove_legacy_aliases",
    "shim_entries",
]
