"""Where graph memory goes at TP > 1 (a script, not a test): per rank, the default decode buckets captured ``full``,
split into what torch's allocator reserved (the graph pool) and what left the device outside it (NCCL's buffers
for captured collectives, graph instantiation); before them, each in its own row, what the engine sets up outside
the graphs: the collectives' buffers (``--warm``) and the vocabulary-parallel head's gather buffer (one for every
bucket, rows of the largest); then two small graphs that isolate a captured all-reduce:

- ``in_place``: 64 all-reduces of one tensor allocated outside the graph (what a captured collective costs by
  itself, no pool in play);
- ``chain``: 64 times ``y = x * 2; all_reduce(y); x = y + 1`` with every tensor allocated inside the capture (what
  the collective does to the pool's reuse of the tensors it touched).

And ``estimate_capture_memory()`` against a repeat capture of the same buckets (its error, as the capture section
reports it at TP=1).

    python bench/profile_tp_memory.py --tp 2 --all-reduce auto process-group --warm both --out tp-memory.json

Each ``--all-reduce`` path is one launch of ``--tp`` ranks per ``--warm`` choice (before capture, the group's
collectives warmed up as the engine does, or not); ``--tp 1`` takes neither. The JSON holds every rank; a table per
launch (``part_rows``: one row per part, one column per rank, GiB) is printed after it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness.presets import preset_config

from cudagraph.backend_utils import read_device_memory
from cudagraph.config import resolve
from cudagraph.engine.distributed import GroupOptions, init_tensor_parallel, launch, shutdown_tensor_parallel
from cudagraph.engine.model import SINGLE_RANK, random_model
from cudagraph.engine.model.collectives import all_reduce_
from cudagraph.engine.model_runner import CacheConfig, ModelRunner
from cudagraph.runner import DecodeCudaGraphRunner

GIB = 2**30


def reading_delta(before: Any, after: Any) -> dict[str, float]:
    """GiB taken between two readings: in all (the driver's free memory), by torch's reserve, and outside it."""
    total = (before.free_bytes - after.free_bytes) / GIB
    reserved = (after.reserved_bytes - before.reserved_bytes) / GIB
    return {"total_gib": total, "torch_reserved_gib": reserved, "outside_torch_gib": total - reserved}


def small_graph(kind: str, group_name: str | None, rows: int, hidden: int, device: torch.device) -> dict[str, float]:
    """Capture one ``kind`` graph (see the module docstring) of 64 all-reduces and say what it took."""
    x = torch.ones(rows, hidden, dtype=torch.bfloat16, device=device)
    before = read_device_memory(device)
    graph = torch.cuda.CUDAGraph()

    def body() -> None:
        current = x
        for _ in range(64):
            if kind == "in_place":
                if group_name is not None:
                    all_reduce_(x, group_name)
                continue
            y = current * 2
            if group_name is not None:
                all_reduce_(y, group_name)
            current = y + 1

    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        body()
    torch.cuda.current_stream(device).wait_stream(stream)
    with torch.cuda.graph(graph):
        body()
    after = read_device_memory(device)
    result = reading_delta(before, after)
    del graph
    torch.cuda.synchronize(device)
    return result


def rank_main(rank: int, world_size: int, init_method: str, payload: tuple[str, str, int, bool]) -> Any:
    """One rank: model, engine, (with ``warm``: the group's collectives warmed up first, as the engine starts a
    group), capture of the default decode buckets, the two small graphs; every rank's figures (gathered to rank 0)."""
    preset, path, max_bs, warm = payload
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    group = init_tensor_parallel(GroupOptions(rank, world_size, device, init_method, 180.0)) if world_size > 1 else None
    try:
        config = preset_config(preset)
        shard = group.shard_plan() if group is not None else SINGLE_RANK
        model = random_model(config, seed=0, dtype="bfloat16", device=device, shard=shard)
        kind = "none"
        warmed_gib = 0.0
        if group is not None:
            kind = group.choose_all_reduce(path, model.dtype, max_bs * config.hidden_size).kind
            if warm:
                warmed_gib = group.warm_collectives(model.dtype, 2048 * config.hidden_size) / GIB
        # The head's gather buffer, reserved here (the model runner would, inside the capture's reading) so that
        # its bytes are read apart from the graphs'.
        before_head = read_device_memory(device)
        model.reserve_logits_rows(max_bs)
        head_gib = reading_delta(before_head, read_device_memory(device))["total_gib"]
        graphs = resolve(decode_cuda_graph_max_bs=max_bs, prefill_disable_cuda_graph=True)
        engine = ModelRunner(
            model,
            graphs,
            cache_config=CacheConfig(max_num_reqs=max_bs + 2, max_context_len=256),
            attention_backend="triton",
            capture_barrier=group.capture_barrier if group is not None else None,
        )
        before = read_device_memory(device)
        started = time.perf_counter()
        runner = engine.init_decode_cuda_graph()
        seconds = time.perf_counter() - started
        after = read_device_memory(device)
        assert runner is not None
        figures: dict[str, Any] = {
            "rank": rank,
            "all_reduce": kind,
            "warmed": warm,
            "collective_buffers_gib": warmed_gib,
            "head_gather_buffer_gib": head_gib,
            "head_gather_buffer_bytes": model.logits_gather.nbytes if model.logits_gather is not None else 0,
            "graphs": len(runner.captured_buckets),
            "capture_seconds": seconds,
            "decode": reading_delta(before, after),
            "kept_allocated_gib": (after.allocated_bytes - before.allocated_bytes) / GIB,
            "largest_shapes_gib": {str(s.bucket): s.bytes / GIB for s in runner.stats.per_bucket[:4]},
        }
        engine.shutdown()
        # The estimate against a repeat capture (as the capture section measures it at TP=1).
        repeat = DecodeCudaGraphRunner(engine, graphs, show_progress=False, capture_barrier=engine.capture_barrier)
        estimate = repeat.estimate_capture_memory()
        repeat_stats = repeat.capture()
        estimated = estimate.total_bytes_for(repeat.captured_buckets)
        figures["estimate_gib"] = estimated / GIB
        figures["repeat_gib"] = repeat_stats.bytes / GIB
        kept = repeat_stats.bytes
        figures["estimate_error"] = (estimated - kept) / kept if kept else None
        repeat.shutdown()
        group_name = group.group_name if group is not None else None
        for rows in (1, 256):
            for small in ("in_place", "chain"):
                figures[f"{small}_rows{rows}"] = small_graph(small, group_name, rows, config.hidden_size, device)
        gathered: list[Any] = [figures]
        if group is not None:
            gathered = [None] * world_size
            dist.all_gather_object(gathered, figures, group=group.cpu_group)
    finally:
        if group is not None:
            shutdown_tensor_parallel(group)
    return gathered


PARTS: tuple[tuple[str, Callable[[dict[str, Any]], float | None]], ...] = (
    (
        "collective buffers (warm-up, outside the graphs)",
        lambda f: f["collective_buffers_gib"] if f["warmed"] else None,
    ),
    ("head gather buffer (outside the graphs, shared)", lambda f: f["head_gather_buffer_bytes"] / GIB),
    ("decode graphs: torch's pool", lambda f: f["decode"]["torch_reserved_gib"]),
    ("decode graphs: outside torch", lambda f: f["decode"]["outside_torch_gib"]),
    ("decode graphs: taken in all", lambda f: f["decode"]["total_gib"]),
    ("decode graphs: repeat capture after shutdown", lambda f: f["repeat_gib"]),
    ("decode graphs: estimate", lambda f: f["estimate_gib"]),
)
"""The rows of a launch's table: what each part took on a rank (``None``: not measured in that launch)."""


def part_rows(ranks: list[dict[str, Any]]) -> list[tuple[str, list[float | None]]]:
    """One row per part of ``PARTS``, each with a figure per rank (GiB)."""
    return [(name, [figure(ranks_figures) for ranks_figures in ranks]) for name, figure in PARTS]


def format_parts(title: str, ranks: list[dict[str, Any]]) -> str:
    """``part_rows`` as a Markdown table under ``title``."""
    header = "| part | " + " | ".join(f"rank {figures['rank']} GiB" for figures in ranks) + " |"
    lines = [f"{title}:", "", header, "|---|" + "---:|" * len(ranks)]
    for name, values in part_rows(ranks):
        cells = " | ".join("-" if value is None else f"{value:.3f}" for value in values)
        lines.append(f"| {name} | {cells} |")
    return "\n".join(lines)


def main() -> int:
    """Launch every path asked for, print and write what each rank took."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="llama-3-8b")
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--all-reduce", nargs="+", default=["auto"])
    parser.add_argument("--max-bs", type=int, default=256)
    parser.add_argument(
        "--warm", choices=("no", "yes", "both"), default="both", help="warm the collectives up before capture"
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    runs = []
    warm_choices = {"no": [False], "yes": [True], "both": [False, True]}[args.warm]
    for path in args.all_reduce if args.tp > 1 else ["none"]:
        for warm in warm_choices if args.tp > 1 else [False]:
            ranks = launch(rank_main, (args.preset, path, args.max_bs, warm), args.tp, exit_timeout_s=180.0)
            runs.append({"tp": args.tp, "requested": path, "warm": warm, "ranks": ranks})
            for figures in ranks:
                print(json.dumps(figures), flush=True)
            title = f"TP={args.tp}, all-reduce {path}, collectives {'warmed' if warm else 'not warmed'}"
            print(format_parts(title, ranks), flush=True)
    if args.out is not None:
        args.out.write_text(json.dumps({"preset": args.preset, "runs": runs}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
