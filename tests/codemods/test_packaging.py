"""The wheel ships the rename table and the example, and reads the same table as a source checkout."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from cudagraph.migrate.renames import load_renames

CODEMODS = Path(__file__).resolve().parents[2] / "codemods"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "-w",
            str(out),
            str(CODEMODS),
        ],
        check=True,
    )
    (built,) = out.glob("cudagraph_migrate-*.whl")
    return built


@pytest.mark.slow
def test_wheel_table_equals_the_checkout_table(wheel: Path, tmp_path: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        packaged = tmp_path / "renames.toml"
        packaged.write_bytes(archive.read("cudagraph/migrate/data/renames.toml"))
    assert load_renames(packaged).rows == load_renames().rows


@pytest.mark.slow
def test_wheel_ships_the_example_and_finds_it_when_installed(wheel: Path, tmp_path: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        archive.extractall(tmp_path / "site")
    example = "cudagraph/migrate/data/examples/legacy_engine/"
    assert f"{example}toy_engine/model_runner.py" in names and f"{example}conftest.py" in names
    assert not [name for name in names if "__pycache__" in name]
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
