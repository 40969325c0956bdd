"""Which graph variants an engine keeps per phase, and which of them each step replayed.

A phase has a ``plain`` variant (the model alone) and, with LoRA, a ``lora`` variant (the adapters applied, captured at
the slots' max rank); speculative verify steps have a plain variant of their own (a verify step with adapters runs
eagerly and counts under ``decode lora``). ``graph_variants`` reads a ``ModelRunner``'s runners and the metrics its
steps were counted in, before a run (what exists, whether it is graphed) or after it (replayed and eager steps, and
why eager). ``generate`` logs it as one ``graph variants:`` line, puts it under ``"graph_variants"`` in ``--json`` and
ends ``--explain`` with it. Nothing here runs or counts anything.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from cudagraph.config import Phase
from cudagraph.runner import ReplayMetrics

from .lora import LoraConfig
from .model_runner import ModelRunner

PLAIN = "plain"
LORA = "lora"
VERIFY = "verify"


@dataclass(frozen=True)
class VariantReport:
    """One graph variant of one phase, and the steps that went to it."""

    phase: str
    """``decode``, ``prefill`` or ``verify`` (speculative verify steps, graphed by the decode phase's backend)."""
    variant: str
    """``plain`` (the model alone) or ``lora`` (the adapters applied)."""
    max_rank: int | None
    """The rank the ``lora`` variant is captured at (``None`` for ``plain``)."""
    graphed: bool
    """Whether the variant has a graph runner (``False``: its steps run eagerly, ``eager_reasons`` says why)."""
    replayed: int
    eager: int
    eager_reasons: dict[str, int]
    """Why steps ran eagerly, in words -> steps."""

    @property
    def name(self) -> str:
        """``decode plain``, ``decode lora (max rank 16)``, ``verify plain``."""
        rank = f" (max rank {self.max_rank})" if self.max_rank is not None else ""
        return f"{self.phase} {self.variant}{rank}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, as ``generate --json`` prints it under ``"graph_variants"``."""
        return asdict(self)

    def counts(self) -> str:
        """``12 replayed, 0 eager``; when steps ran eagerly, why in parentheses (each reason's steps after it when
        there are several): ``0 replayed, 3 eager (graphs off: CUDA graphs need a CUDA device)``."""
        text = f"{self.replayed} replayed, {self.eager} eager"
        if len(self.eager_reasons) == 1:
            text += f" ({next(iter(self.eager_reasons))})"
        elif self.eager_reasons:
            text += " (" + "; ".join(f"{reason}: {steps}" for reason, steps in self.eager_reasons.items()) + ")"
        return text


def _report(phase: str, variant: str, max_rank: int | None, runner: object, metrics: ReplayMetrics) -> VariantReport:
    reasons = {row.reason.text: row.steps for row in metrics.eager_rows()}
    return VariantReport(phase, variant, max_rank, runner is not None, metrics.replays, metrics.eager, reasons)


def graph_variants(model_runner: ModelRunner) -> tuple[VariantReport, ...]:
    """Every variant ``model_runner`` keeps, phase by phase (plain, then lora), then verify when it has a verify
    runner or ran verify steps; read before its ``shutdown`` to see which are graphed."""
    lora = model_runner.lora
    rank = lora.config.max_rank if lora is not None else None
    runners = {
        Phase.DECODE: (model_runner.decode_cuda_graph_runner, model_runner.lora_decode_cuda_graph_runner),
        Phase.PREFILL: (model_runner.prefill_cuda_graph_runner, model_runner.lora_prefill_cuda_graph_runner),
    }
    reports = []
    for phase, (plain, with_lora) in runners.items():
        reports.append(_report(str(phase), PLAIN, None, plain, model_runner.cuda_graph_metrics[phase]))
        if lora is not None:
            reports.append(_report(str(phase), LORA, rank, with_lora, model_runner.lora_cuda_graph_metrics[phase]))
    verify, verify_metrics = model_runner.verify_cuda_graph_runner, model_runner.verify_cuda_graph_metrics
    if verify is not None or verify_metrics.steps:
        reports.append(_report(VERIFY, PLAIN, None, verify, verify_metrics))
    return tuple(reports)


def variants_line(reports: tuple[VariantReport, ...]) -> str:
    """One log line: ``graph variants: decode plain 7 replayed, 0 eager; decode lora (max rank 8) 5 replayed, ...``."""
    return "graph variants: " + "; ".join(f"{report.name} {report.counts()}" for report in reports)


def planned_variants(lora: LoraConfig | None) -> str:
    """``--explain`` rows before any model work, one per phase: the variants it will keep (``plain``, and with
    ``lora`` the ``lora`` variant at its max rank, slots and target modules)."""
    variants = PLAIN
    if lora is not None:
        targets = " ".join(lora.target_modules)
        variants += f", {LORA} (max rank {lora.max_rank}, {lora.max_loras} slots, {targets})"
    rows = [(f"{phase}.variants", variants) for phase in Phase]
    width = max(len(key) for key, _ in rows)
    return "\n".join(f"{key:<{width}}  {text}" for key, text in rows)


def explain_variants(reports: tuple[VariantReport, ...], *, after_run: bool) -> str:
    """``--explain`` rows, one per variant, aligned like ``CudaGraphConfig.explain``: ``<phase>.<variant>`` then
    whether it is graphed and, ``after_run``, its replayed and eager steps."""
    rows = []
    for report in reports:
        key = f"{report.phase}.variant.{report.variant}"
        graphed = "graphed" if report.graphed else "not graphed"
        rank = f", max rank {report.max_rank}" if report.max_rank is not None else ""
        text = f"{graphed}{rank}"
        if after_run:
            text += f"; steps: {report.counts()}"
        rows.append((key, text))
    width = max((len(key) for key, _ in rows), default=0)
    return "\n".join(f"{key:<{width}}  {text}" for key, text in rows)
