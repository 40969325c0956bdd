"""How fast a ``generate`` ran, in the numbers users of SGLang and vLLM read: one log line and a JSON object.

Tokens: every prompt's and every generated one. Time to first token: from the start of generation (every prompt
arrives then) to each prompt's first generated token, averaged over the prompts. Decode tokens per second: the tokens
that decode and verify steps produced over the wall time of those steps (prefill steps and mixed steps, which carry
prompt tokens, are not in it). Steps replayed and eager: what the engine's replay metrics counted, every phase (both
graph variants, with LoRA) and the verify steps. Capture time and graph memory: what the engine's graph runners took
to capture (0 where none captured: on a CPU, or with graphs off). Each step ends in a host read of its sampled
tokens, so its wall time includes the device's work. Nothing here runs or times anything; it reads what the loop and
the runners recorded.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from cudagraph.runner import CaptureStats, ReplayMetrics

from .generate import GenerationOutput, GenerationStats
from .lifecycle import graph_runners
from .model_runner import ModelRunner


@dataclass(frozen=True)
class SpeedReport:
    """One generate's speed (see the module docstring for what each number measures)."""

    prompt_tokens: int
    generated_tokens: int
    time_to_first_token_s: float
    """Mean over the prompts, from the start of generation."""
    decode_tokens_per_s: float | None
    """``None`` when no decode or verify step ran (every prompt asked for one token)."""
    total_s: float
    """Wall time of the whole generation, prefill and decode."""
    steps_replayed: int
    steps_eager: int
    capture_s: float
    """Wall time of every graph capture of the engine (0.0 when nothing was captured)."""
    graph_memory_bytes: int
    """Device memory the captured graphs kept (0 when nothing was captured)."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON object ``generate --json`` prints under ``"speed"``."""
        return asdict(self)

    def line(self) -> str:
        """One line for the log, e.g. ``speed: 3 prompt tokens, 12 generated; time to first token 4.1 ms; decode
        310.5 tokens/s; steps 11 replayed, 1 eager; graphs captured in 0.41 s, 0.092 GiB``."""
        decode = "no decode step" if self.decode_tokens_per_s is None else f"{self.decode_tokens_per_s:.1f} tokens/s"
        return (
            f"speed: {self.prompt_tokens} prompt tokens, {self.generated_tokens} generated in {self.total_s:.3f} s; "
            f"time to first token {1000 * self.time_to_first_token_s:.1f} ms; decode {decode}; "
            f"steps {self.steps_replayed} replayed, {self.steps_eager} eager; "
            f"graphs captured in {self.capture_s:.2f} s, {self.graph_memory_bytes / 2**30:.3f} GiB"
        )


def speed_report(
    prompts: Sequence[Sequence[int]],
    outputs: Sequence[GenerationOutput],
    stats: GenerationStats,
    metrics: Iterable[ReplayMetrics],
    captures: Iterable[CaptureStats],
) -> SpeedReport:
    """The speed of one generation: its ``prompts`` and ``outputs``, the loop's ``stats``, every ``metrics`` the
    engine counted steps into, and the ``captures`` of its graph runners."""
    first_tokens = stats.first_token_s
    decode_s = stats.decode_seconds
    captured = list(captures)
    counted = list(metrics)
    return SpeedReport(
        prompt_tokens=sum(len(prompt) for prompt in prompts),
        generated_tokens=sum(len(output.output_token_ids) for output in outputs),
        time_to_first_token_s=sum(first_tokens) / len(first_tokens) if first_tokens else 0.0,
        decode_tokens_per_s=stats.decode_tokens / decode_s if stats.decode_tokens and decode_s > 0 else None,
        total_s=stats.seconds,
        steps_replayed=sum(phase.replays for phase in counted),
        steps_eager=sum(phase.eager for phase in counted),
        capture_s=sum((capture.seconds for capture in captured), 0.0),
        graph_memory_bytes=sum(capture.bytes for capture in captured),
    )


def engine_speed(
    model_runner: ModelRunner,
    prompts: Sequence[Sequence[int]],
    outputs: Sequence[GenerationOutput],
    stats: GenerationStats,
) -> SpeedReport:
    """``speed_report`` of a generation ``model_runner`` ran, read before its ``shutdown`` (which drops its graph
    runners): its phases' and verify steps' metrics and its LoRA variants', and the captures of every graph runner."""
    captures = [runner.stats for runner in graph_runners(model_runner)]
    return speed_report(prompts, outputs, stats, model_runner.step_metrics, captures)
