"""What ``nox -s bench`` calls: the benchmark harness (``bench/harness``), run with the workspace importable.

    python3 bench/run.py [--quick] [--check]
                         [--sections decode,breaks,prefill,speculative,capture,compile,lifecycle,migration]
                         [--presets P...] [--batch-sizes N...] [--configs NAME...]
    python3 bench/run.py --sections tp [--tp-sizes 1 2 4] [--presets llama-3-8b]   # starts its own ranks
                         [--kernel-counts separate|inline|off]   # decode kernel counts: a second process by default
    python3 bench/run.py compare OLD.json NEW.json        # exit 1 when a ratio got more than 10 % worse
    python3 bench/run.py merge RUN.json... --out ALL.json  # one result from runs split over several calls
    python3 bench/run.py show RESULT.json [--markdown]     # a saved result's tables and targets
    python3 bench/run.py scripts [NAME...] [--check] [-- ARGS]   # the older bench/bench_*.py scripts

The harness runs in a child process whose ``PYTHONPATH`` holds the workspace sources and the carried wheels (``.whl/``
unpacked into ``.site/``, the peers and flashinfer), the way ``tests/gpu/run.py`` sets them up. ``compare``,
``merge`` and ``show`` need neither torch nor a GPU. ``scripts`` runs each selected ``bench/bench_*.py`` as
``--out bench-results/NAME.json`` and records every exit status in ``bench-results/summary.json``.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
RESULTS = ROOT / "bench-results"


def _gpu_runner() -> Any:
    """``tests/gpu/run.py`` as a module (its environment set-up and device check)."""
    spec = importlib.util.spec_from_file_location("gpu_run", ROOT / "tests" / "gpu" / "run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def workspace_env() -> dict[str, str]:
    """The GPU test runner's environment (workspace sources and carried wheels importable), plus ``bench/``."""
    env: dict[str, str] = _gpu_runner().workspace_env()
    env["PYTHONPATH"] = f"{BENCH}:{env['PYTHONPATH']}" if env.get("PYTHONPATH") else str(BENCH)
    return env


def run_harness(argv: list[str]) -> int:
    """``python -m harness ARGV`` in the workspace environment."""
    return subprocess.call([sys.executable, "-m", "harness", *argv], env=workspace_env(), cwd=ROOT)


def run_in_process(argv: list[str]) -> int:
    """``compare ...``, ``merge ...`` or ``show ...`` (``argv`` starting with the command): the harness's own
    dispatch, in this process, since none of them needs torch, a GPU or the carried wheels."""
    sys.path.insert(0, str(BENCH))
    from harness.cli import main as harness_main

    return harness_main(argv)


def run_scripts(argv: list[str]) -> int:
    """Run the selected ``bench/bench_*.py``; 0 when all of them succeeded (and, with ``--check``, met their
    targets)."""
    reason = _gpu_runner().unavailable_reason()
    if reason is not None:
        print(f"benchmark scripts skipped: {reason}")
        return 0
    passthrough = argv[argv.index("--") + 1 :] if "--" in argv else []
    selectors = argv[: argv.index("--")] if "--" in argv else argv
    check = "--check" in selectors
    selectors = [selector for selector in selectors if selector != "--check"]
    scripts = sorted(BENCH.glob("bench_*.py"))
    scripts = [s for s in scripts if not selectors or any(sel in s.stem for sel in selectors)]
    if not scripts:
        print(f"no bench/bench_*.py matches {selectors}", file=sys.stderr)
        return 2
    RESULTS.mkdir(exist_ok=True)
    env = workspace_env()
    summary: dict[str, dict[str, Any]] = {}
    for script in scripts:
        output = RESULTS / f"{script.stem}.json"
        output.unlink(missing_ok=True)
        print(f"== {script.relative_to(ROOT)}", flush=True)
        started = time.perf_counter()
        status = subprocess.call(
            [sys.executable, str(script), "--out", str(output), *passthrough],
            env={**env, "BENCH_OUTPUT": str(output)},
            cwd=ROOT,
        )
        result = json.loads(output.read_text()) if output.is_file() else None
        summary[script.stem] = {"returncode": status, "seconds": time.perf_counter() - started, "result": result}
        if status != 0 or result is None:
            print(f"!! {script.name} exited {status}{'' if result else ' without writing ' + str(output)}")
    (RESULTS / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"results in {RESULTS.relative_to(ROOT)}/")
    ran = all(value["returncode"] == 0 and value["result"] is not None for value in summary.values())
    missed = [f"{name}: {target}" for name, value in summary.items() for target in missed_targets(value["result"])]
    if check and missed:
        print("targets missed:\n  " + "\n  ".join(missed))
    return 0 if ran and not (check and missed) else 1


def missed_targets(result: object) -> list[str]:
    """The targets a script's JSON result states as missed (its ``checks``: target -> met)."""
    checks = result.get("checks", {}) if isinstance(result, dict) else {}
    return [target for target, met in checks.items() if not met]


IN_PROCESS_COMMANDS = frozenset({"compare", "merge", "show"})
"""First arguments that run in this process (pure Python); ``scripts`` runs the older scripts; anything else goes to
the harness's child process."""


def main(argv: list[str]) -> int:
    """Dispatch to ``compare``, ``merge``, ``show``, ``scripts`` or the harness."""
    if argv and argv[0] in IN_PROCESS_COMMANDS:
        return run_in_process(argv)
    if argv and argv[0] == "scripts":
        return run_scripts(argv[1:])
    return run_harness(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
