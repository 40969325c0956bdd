"""Deprecation warnings that point at the user's line, once per use site.

A legacy name can be reached from many frames: ``import m; m.Name``, ``from m import Name`` (directly, or from a
package ``__init__`` being imported, where importlib's own frames sit in between), or an aliased method call. Rather
than guessing a ``stacklevel``, the warning is issued with ``warnings.warn_explicit`` at the first frame outside this
package and outside importlib, so the filename and line are the user's whatever the path. Each site warns once per
process; a warning turned into an error (``-W error``) is not recorded, so it raises again at the next use.
"""

from __future__ import annotations

import sys
import threading
import warnings
from pathlib import Path
from types import FrameType

_PACKAGE_DIR = str(Path(__file__).resolve().parent)
_IMPORTLIB_PREFIXES = ("<frozen importlib", "<frozen zipimport")
_warned_sites: set[tuple[str, int, str]] = set()
_lock = threading.Lock()


def _user_frame() -> FrameType | None:
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        inside_shims = str(Path(filename).resolve().parent) == _PACKAGE_DIR if not filename.startswith("<") else False
        if not inside_shims and not filename.startswith(_IMPORTLIB_PREFIXES):
            return frame
        frame = frame.f_back
    return None


def warn_legacy_use(key: str, message: str) -> None:
    """Issue ``message`` as a ``DeprecationWarning`` at the user's line, once per (file, line, ``key``)."""
    frame = _user_frame()
    filename = frame.f_code.co_filename if frame is not None else "<unknown>"
    lineno = frame.f_lineno if frame is not None else 0
    site = (filename, lineno, key)
    with _lock:
        if site in _warned_sites:
            return
    module = frame.f_globals.get("__name__", "<unknown>") if frame is not None else "<unknown>"
    warnings.warn_explicit(message, DeprecationWarning, filename, lineno, module=module)
    with _lock:
        _warned_sites.add(site)


def forget_warned_sites() -> None:
    """Forget which sites have warned (for tests that reuse a site)."""
    with _lock:
        _warned_sites.clear()
