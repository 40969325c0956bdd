"""The table of SGLang's re-exports of ``ServerArgs`` and ``Engine``: read from released trees, current with them, and
what ties a call through a re-export to SGLang's options."""

from __future__ import annotations

from pathlib import Path

import pytest

from cudagraph.migrate import sglang_reexports
from cudagraph.migrate.options import RunOptions
from cudagraph.migrate.renames import load_renames
from cudagraph.migrate.rules import RULES
from cudagraph.migrate.rules.base import FindingKind
from cudagraph.migrate.source_migration import migrate_source

SERVER_ARGS = "sglang.srt.server_args.ServerArgs"
ENGINE = "sglang.srt.entrypoints.engine.Engine"

# A release in miniature: the shapes SGLang re-exports its classes in, and the shapes that are no re-export.
MINI_RELEASE = {
    "__init__.py": (
        "from sglang.lang.api import Engine\n"
        "from sglang.utils import LazyImport\n"
        'ServerArgs = LazyImport("sglang.srt.server_args", "ServerArgs")\n'
        'Engine = LazyImport("sglang.srt.entrypoints.engine", "Engine")\n'
    ),
    "utils.py": "class LazyImport:\n    def __init__(self, module, name):\n        pass\n",
    "lang/__init__.py": "",
    "lang/api.py": "def Engine(*args, **kwargs):\n    from sglang.srt.entrypoints.engine import Engine\n",
    "srt/__init__.py": "",
    "srt/server_args.py": "class ServerArgs:\n    pass\n",
    "srt/entrypoints/__init__.py": "",
    "srt/entrypoints/engine.py": "from sglang.srt.server_args import ServerArgs\n\n\nclass Engine:\n    pass\n",
    "srt/entrypoints/http_server.py": (
        "from typing import TYPE_CHECKING\n"
        "from sglang.srt.entrypoints.engine import Engine as _Engine, ServerArgs\n"
        "if TYPE_CHECKING:\n"
        "    from sglang.srt.server_args import ServerArgs as Hinted\n"
        "try:\n"
        "    from sglang.srt.server_args import ServerArgs as Tried\n"
        "except ImportError:\n"
        "    Tried = None\n"
    ),
    "srt/entrypoints/rebound.py": "from sglang.srt.server_args import ServerArgs\nServerArgs = dict\n",
    "srt/_private.py": "from sglang.srt.server_args import ServerArgs\n",
    "srt/ray_server.py": "from sglang.srt.entrypoints.http_server import ServerArgs\n",
}


def _write_release(root: Path) -> Path:
    for relative, text in MINI_RELEASE.items():
        path = root / "sglang" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (root / "sglang" / "_version.py").write_text("__version__ = version = '9.9.9'\n")
    return root / "sglang"


def test_the_scan_finds_run_time_reexports_and_only_those(tmp_path: Path) -> None:
    data = sglang_reexports.scan_reexports([_write_release(tmp_path)])
    assert data["releases"] == ["9.9.9"]
    assert data["reexports"] == {
        "sglang.ServerArgs": SERVER_ARGS,  # a lazy import at the top level (the owners themselves are left out)
        "sglang.srt.entrypoints.engine.ServerArgs": SERVER_ARGS,
        "sglang.srt.entrypoints.http_server.ServerArgs": SERVER_ARGS,  # through engine's own import
        "sglang.srt.entrypoints.http_server.Tried": SERVER_ARGS,  # bound inside try (the except rebinds it too)
        "sglang.srt.ray_server.ServerArgs": SERVER_ARGS,  # a re-export of a re-export
    }


def test_the_owners_are_the_classes_that_take_sglangs_options() -> None:
    assert sglang_reexports.option_owners(load_renames()) == ["sglang.Engine", ENGINE, SERVER_ARGS]


def test_a_call_through_a_reexport_is_listed_as_sglangs() -> None:
    source = (
        "import sglang\n"
        "from sglang.srt.entrypoints.http_server import ServerArgs\n"
        "\n"
        "\n"
        "def build():\n"
        "    return ServerArgs(disable_cuda_graph=True), sglang.ServerArgs(cuda_graph_max_bs=8)\n"
    )
    for rewrite in (False, True):
        result = migrate_source(
            source, "rl/build.py", RULES, load_renames(), RunOptions(rewrite_engine_options=rewrite)
        )
        listed = [str(finding) for finding in result.findings if finding.kind is FindingKind.ARGV]
        if rewrite:
            assert listed == [] and result.edits == {"CG403": 2}
            assert (
                "ServerArgs(decode_disable_cuda_graph=True, prefill_disable_cuda_graph=True)"
                in result.migrated.decode()
            )
            assert "sglang.ServerArgs(decode_cuda_graph_max_bs=8)" in result.migrated.decode()
        else:
            assert [line.split(": ")[0] for line in listed] == ["CG403 6", "CG403 6"]
            assert "ServerArgs(...)" in listed[0] and "sglang.ServerArgs(...)" in listed[1]


@pytest.mark.realtrees
def test_the_table_is_what_the_released_trees_say(capsys: pytest.CaptureFixture[str]) -> None:
    from realtrees.trees import TREES

    trees = [tree for tree in TREES if tree.distribution == "sglang"]
    for tree in trees:
        if not tree.ready():
            pytest.skip(tree.unavailable_reason())
    packages = [str(tree.path() / "sglang") for tree in trees]
    assert sglang_reexports.main([arg for package in packages for arg in ("--sglang", package)] + ["--check"]) == 0, (
        capsys.readouterr().err
    )
    table = sglang_reexports.load_sglang_reexports()
    assert table["sglang.srt.entrypoints.http_server.ServerArgs"] == SERVER_ARGS
    assert table["sglang.ServerArgs"] == SERVER_ARGS
