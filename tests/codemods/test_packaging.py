"""The wheels ship the rename table (in cudagraph-config, its owner) and the example (in cudagraph-migrate), and an
installed cudagraph-migrate reads the same table as a source checkout."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from cudagraph.migrate.renames import load_renames

ROOT = Path(__file__).resolve().parents[2]
CODEMODS = ROOT / "codemods"
CONFIG = ROOT / "packages" / "cudagraph-config"


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(CODEMODS), str(CONFIG)],
        check=True,
    )
    (migrate,) = out.glob("cudagraph_migrate-*.whl")
    (config,) = out.glob("cudagraph_config-*.whl")
    return {"migrate": migrate, "config": config}


@pytest.mark.slow
def test_wheel_table_equals_the_checkout_table(wheels: dict[str, Path], tmp_path: Path) -> None:
    with zipfile.ZipFile(wheels["config"]) as archive:
        packaged = tmp_path / "renames.toml"
        packaged.write_bytes(archive.read("cudagraph/config/data/renames.toml"))
    assert load_renames(packaged).rows == load_renames().rows
    with zipfile.ZipFile(wheels["migrate"]) as archive:
        assert not [name for name in archive.namelist() if name.endswith("renames.toml")]  # one copy, in its owner


@pytest.mark.slow
def test_wheel_ships_the_example_and_finds_it_when_installed(wheels: dict[str, Path], tmp_path: Path) -> None:
    with zipfile.ZipFile(wheels["migrate"]) as archive:
        names = archive.namelist()
        archive.extractall(tmp_path / "site")
    with zipfile.ZipFile(wheels["config"]) as archive:
        archive.extractall(tmp_path / "site")
    example = "cudagraph/migrate/data/examples/legacy_engine/"
    assert f"{example}toy_engine/model_runner.py" in names and f"{example}conftest.py" in names
    assert not [name for name in names if "__pycache__" in name]
    data = {f"cudagraph/migrate/{name}" for name in ("exports.json", "legacy_api.json", "sglang_reexports.json")}
    assert data <= set(names), sorted(data - set(names))  # the generated tables the rules read
    code = (
        "from cudagraph.migrate import example, renames;"
        "print(example.example_source()); print(renames.renames_path()); print(len(renames.load_renames()))"
    )
    result = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(tmp_path / 'site')!r}); {code}"],
        capture_output=True,
        text=True,
        check=True,
    )
    example_path, table_path, rows = result.stdout.split()
    assert example_path.startswith(str(tmp_path / "site")) and table_path.startswith(str(tmp_path / "site"))
    assert int(rows) == len(load_renames())
