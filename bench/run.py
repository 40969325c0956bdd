"""Run every ``bench/bench_*.py`` with the current interpreter and collect their JSON into ``bench-results/``.

What ``nox -s bench`` calls. Each script is run as ``python3 bench/bench_NAME.py --out
bench-results/bench_NAME.json`` (the path is also in ``$BENCH_OUTPUT``), with the workspace sources importable the
way ``tests/gpu/run.py`` sets them up (carried wheels in ``.whl/`` included). ``bench-results/summary.json`` records
every script's exit status and result. Positional arguments select scripts by substring (``python3 bench/run.py
engine``); ``--`` passes the rest to every script.
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
RESULTS = ROOT / "bench-results"


def _gpu_runner() -> Any:
    """``tests/gpu/run.py`` as a module (its environment set-up and device check)."""
    spec = importlib.util.spec_from_file_location("gpu_run", ROOT / "tests" / "gpu" / "run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def workspace_env() -> dict[str, str]:
    """The GPU test runner's environment: workspace sources (and carried wheels) on ``PYTHONPATH``."""
    return _gpu_runner().workspace_env()


def main(argv: list[str]) -> int:
    """Run the selected benchmarks; 0 when all of them succeeded (or, without torch or CUDA, one line saying so)."""
    reason = _gpu_runner().unavailable_reason()
    if reason is not None:
        print(f"benchmarks skipped: {reason}")
        return 0
    passthrough = argv[argv.index("--") + 1 :] if "--" in argv else []
    selectors = argv[: argv.index("--")] if "--" in argv else argv
    check = "--check" in selectors
    selectors = [selector for selector in selectors if selector != "--check"]
    scripts = sorted((ROOT / "bench").glob("bench_*.py"))
    scripts = [s for s in scripts if not selectors or any(sel in s.stem for sel in selectors)]
    if not scripts:
        print(f"no bench/bench_*.py matches {selectors}", file=sys.stderr)
        return 2
    RESULTS.mkdir(exist_ok=True)
    env = workspace_env()
    summary: dict[str, object] = {}
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
    ran = all(v["returncode"] == 0 and v["result"] is not None for v in summary.values())  # type: ignore[index]
    missed = [f"{name}: {target}" for name, value in summary.items() for target in missed_targets(value["result"])]  # type: ignore[index]
    if check and missed:
        print("targets missed:\n  " + "\n  ".join(missed))
    return 0 if ran and not (check and missed) else 1


def missed_targets(result: object) -> list[str]:
    """The targets a script's JSON result states as missed (its ``checks``: target -> met)."""
    checks = result.get("checks", {}) if isinstance(result, dict) else {}
    return [target for target, met in checks.items() if not met]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
