"""Every symbol row served by a legacy module: identity, one warning at the user's line, ``dir``, did-you-mean."""

from __future__ import annotations

import importlib
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from cudagraph.legacy import LEGACY_MODULES, forget_warned_sites, shim_entries

ENTRIES = shim_entries()


@pytest.fixture(autouse=True)
def _fresh_sites() -> None:
    forget_warned_sites()


def _run_file(path: Path) -> dict[str, object]:
    namespace: dict[str, object] = {"__name__": "user_module"}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    return namespace


def test_every_legacy_module_has_a_shim() -> None:
    assert set(LEGACY_MODULES) == {
        "cudagraph.legacy.cuda_graph_runner",
        "cudagraph.legacy.piecewise_context_manager",
        "cudagraph.legacy.breakable_cuda_graph",
        "cudagraph.legacy.server_args",
    }
    for module in LEGACY_MODULES:
        assert importlib.import_module(module).__name__ == module


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda entry: entry.row.old)
def test_from_import_returns_the_new_object_and_warns_once_at_the_users_line(entry, tmp_path: Path) -> None:
    row = entry.row
    user_file = tmp_path / "user_code.py"
    user_file.write_text(
        textwrap.dedent(
            f"""\
            import {row.old_module} as legacy
            from {row.old_module} import {row.old_name} as first
            again = legacy.{row.old_name}
            for _ in range(3):
                looped = legacy.{row.old_name}
            """
        )
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        namespace = _run_file(user_file)
    new_object = getattr(importlib.import_module(row.new_module), row.new_name)
    assert namespace["first"] is new_object
    assert namespace["again"] is new_object
    assert namespace["looped"] is new_object
    deprecations = [w for w in caught if issubclass(w.category, DeprecationWarning) and row.old in str(w.message)]
    # One per use site: lines 2, 3 and 5 (the loop body warns once, not three times).
    assert [(Path(w.filename), w.lineno) for w in deprecations] == [(user_file, 2), (user_file, 3), (user_file, 5)]
    message = str(deprecations[0].message)
    assert f"from {row.new_module} import {row.new_name}" in message
    assert row.removed_in in message


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda entry: entry.row.old)
def test_dir_lists_the_legacy_name(entry) -> None:
    assert entry.row.old_name in dir(importlib.import_module(entry.row.old_module))


def test_from_import_in_a_package_init_points_at_the_init(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "legacy_user_pkg"
    package.mkdir()
    (package / "__init__.py").write_text(
        '"""A user package."""\n\nfrom cudagraph.legacy.cuda_graph_runner import freeze_gc\n'
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module("legacy_user_pkg")
    sys.modules.pop("legacy_user_pkg", None)
    from cudagraph.backend_utils import freeze_gc

    assert module.freeze_gc is freeze_gc
    (warning,) = [w for w in caught if issubclass(w.category, DeprecationWarning)]
    assert Path(warning.filename) == package / "__init__.py"
    assert warning.lineno == 3


def test_unknown_name_raises_attribute_error_with_a_hint() -> None:
    module = importlib.import_module("cudagraph.legacy.cuda_graph_runner")
    with pytest.raises(AttributeError, match=r"has no attribute 'CudaGraphRuner'; did you mean 'CudaGraphRunner'\?"):
        module.CudaGraphRuner  # noqa: B018
    with pytest.raises(AttributeError, match=r"has no attribute 'zzz'$"):
        module.zzz  # noqa: B018


def test_error_filter_turns_each_use_into_an_error(tmp_path: Path) -> None:
    user_file = tmp_path / "strict.py"
    user_file.write_text("from cudagraph.legacy.server_args import Phase\n")
    for _ in range(2):  # a use that raised is not recorded as warned: it raises again
        with warnings.catch_warnings():
            warnings.simplefilter("error", DeprecationWarning)
            with pytest.raises(DeprecationWarning, match=r"cudagraph\.legacy\.server_args\.Phase"):
                _run_file(user_file)
