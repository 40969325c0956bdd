"""PNG plots a person reads at a glance: decode step time against batch size per backend (log-log, one file per
preset) and prefill speed-up over eager against tokens. Needs matplotlib (present on the GPU machine); without it,
``draw_plots`` says so and draws nothing."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from .rows import BenchResult


def plots_unavailable_reason() -> str | None:
    """Why no plots can be drawn here, or None."""
    if importlib.util.find_spec("matplotlib") is None:
        return "matplotlib is not installed"
    return None


def draw_plots(result: BenchResult, directory: Path, stem: str) -> list[Path]:
    """Write the plots of ``result`` into ``directory`` as ``STEM-*.png``; the paths written."""
    if plots_unavailable_reason() is not None:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for preset in sorted({row.preset for row in result.decode}):
        figure, axes = plt.subplots(figsize=(8, 5))
        rows = [row for row in result.decode if row.preset == preset]
        for backend in dict.fromkeys(row.backend for row in rows):
            points = sorted((row.batch_size, row.step_ms) for row in rows if row.backend == backend)
            style = "--" if backend in ("raw", "eager") else "-"
            axes.plot(*zip(*points, strict=True), style, marker="o", label=backend)
        floor = sorted({(row.batch_size, row.floor_ms) for row in rows})
        axes.plot(*zip(*floor, strict=True), ":", color="grey", label="weight-bandwidth floor")
        axes.set(xscale="log", yscale="log", xlabel="batch size", ylabel="step time (ms)", title=f"decode, {preset}")
        axes.legend(fontsize="small")
        axes.grid(True, which="both", alpha=0.3)
        path = directory / f"{stem}-decode-{preset}.png"
        figure.savefig(path, dpi=120, bbox_inches="tight")
        plt.close(figure)
        written.append(path)
    prefill = [row for row in result.prefill if row.speedup is not None and row.backend != "eager"]
    if prefill:
        figure, axes = plt.subplots(figsize=(8, 5))
        for preset, backend in dict.fromkeys((row.preset, row.backend) for row in prefill):
            label = f"{preset} {backend}"
            points = sorted(
                (row.tokens, row.speedup or 0.0) for row in prefill if (row.preset, row.backend) == (preset, backend)
            )
            axes.plot(*zip(*points, strict=True), marker="o", label=label)
        axes.axhline(1.0, color="grey", linestyle=":")
        axes.set(xscale="log", xlabel="tokens in the step", ylabel="speed-up over eager", title="prefill")
        axes.legend(fontsize="small")
        axes.grid(True, which="both", alpha=0.3)
        path = directory / f"{stem}-prefill.png"
        figure.savefig(path, dpi=120, bbox_inches="tight")
        plt.close(figure)
        written.append(path)
    return written
