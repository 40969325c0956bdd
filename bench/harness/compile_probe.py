"""One ``tc_piecewise`` (inductor) decode capture in a process of its own; prints one JSON line with the compile
seconds and the whole capture's seconds. ``capture.run_compile`` runs it twice over one compile cache directory:
the first run is cold, the second warm, as a second engine start would be."""

from __future__ import annotations

import argparse
import json
import sys

from cudagraph.config import resolve
from cudagraph.engine.model_runner import CacheConfig
from cudagraph.runner import DecodeCudaGraphRunner

from .workload import build_model_runner


def main(argv: list[str]) -> int:
    """Capture, print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", required=True)
    parser.add_argument("--attention-backend", default="torch")
    parser.add_argument("--buckets", type=int, nargs="+", help="decode batch sizes (default: the config's defaults)")
    args = parser.parse_args(argv)
    settings: dict[str, object] = {
        "decode_cuda_graph_backend": "tc_piecewise",
        "tc_piecewise_compiler": "inductor",
        "prefill_disable_cuda_graph": True,
    }
    if args.buckets:
        settings["decode_cuda_graph_bs"] = args.buckets
    config = resolve(**settings)
    buckets = config.decode.buckets
    cache = CacheConfig(max_num_reqs=max(buckets), max_context_len=256)
    model_runner = build_model_runner(args.preset, cache, args.attention_backend)
    model_runner.use_kernels(model_runner.kernels_for(config))  # the set the engine compiles with this config
    runner = DecodeCudaGraphRunner(model_runner, config, show_progress=False)
    stats = runner.capture()
    if runner.eager_reason is not None:
        runner.shutdown()
        raise SystemExit(f"the tc_piecewise runner fell back to eager, nothing was compiled: {runner.eager_reason}")
    compile_stats = getattr(runner.backend, "compile_stats", None)
    if compile_stats is None:
        raise SystemExit(f"{type(runner.backend).__name__} keeps no compile stats; expected the tc_piecewise backend")
    runner.shutdown()
    figures = {
        "compile_seconds": compile_stats.compile_seconds,
        "capture_seconds": stats.seconds,
        "graphs": stats.graphs,
        "cache_hits": compile_stats.cache_hits,
        "cache_misses": compile_stats.cache_misses,
        "pieces_compiled": getattr(compile_stats, "pieces_compiled", None),
        "pieces_reused": getattr(compile_stats, "pieces_reused", None),
    }
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
