"""``bench/bench_lora.py``'s tile sweep: it covers the table's decode tile (so the sweep says how the table's choice
compares), its tiles are distinct, ``--sweep`` needs ``--kernels``, and a CPU smoke of the sweep under Triton's
interpreter writes each projection's tiles fastest first."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

import bench_lora
import pytest

from cudagraph.engine.kernels.triton.lora import lora_tile


def test_the_sweep_covers_the_tables_decode_tile_and_no_tile_twice() -> None:
    tiles = [asdict(tile) for tile in bench_lora.sweep_tiles(8)]
    assert len({tuple(tile.values()) for tile in tiles}) == len(tiles)
    assert asdict(lora_tile(8)) | {"max_tokens": 8} in tiles


def test_sweep_without_kernels_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        bench_lora.main(["--sweep", "--device", "cpu", "--preset", "tiny-llama"])
    assert exit_info.value.code == 2
    assert "--sweep times the fused delta's tiles: it goes with --kernels" in capsys.readouterr().err


@pytest.mark.slow  # two tiles of both kernels under Triton's interpreter
def test_a_cpu_sweep_writes_every_tile_fastest_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the fused delta runs on CPU tensors under TRITON_INTERPRET=1 only")
    monkeypatch.setattr(bench_lora, "SWEEP_SPLITS", (1, 4))
    monkeypatch.setattr(bench_lora, "SWEEP_BLOCK_K", (64,))
    monkeypatch.setattr(bench_lora, "SWEEP_SHRINK_N", (16,))
    monkeypatch.setattr(bench_lora, "SWEEP_EXPAND_N", (32,))
    out = tmp_path / "kernels.json"
    argv = ["--kernels", "--sweep", "--device", "cpu", "--preset", "tiny-llama", "--steps", "1", "--batch", "3"]
    assert bench_lora.main([*argv, "--out", str(out)]) == 0
    sweep = json.loads(out.read_text())["sweep"]
    assert set(sweep) == {"qkv", "o"}
    for timed in sweep.values():
        assert sorted(entry["tile"]["split_k"] for entry in timed) == [1, 4]
        times = [entry["per_layer_us"] for entry in timed]
        assert times == sorted(times) and all(time > 0 for time in times)
