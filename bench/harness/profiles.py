"""The two run profiles as data: ``full`` (every preset, batch size and shape of the issue) and ``quick`` (a smoke run
of every section and configuration; on an H200 with cold compile caches it took about 13 minutes of one GPU,
inductor compiles included (2026-11-28): run it with ``--sections`` and ``--configs`` split over calls where a call
has a time limit, then ``merge``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Iterations:
    """How many steps to warm up and to time."""

    warmup: int
    timed: int


@dataclass(frozen=True)
class Profile:
    """Sizes and iteration counts of a run."""

    presets: tuple[str, ...]
    batch_sizes: tuple[int, ...]
    context_len: int
    iterations: Iterations
    prefill_shapes: tuple[tuple[int, int], ...]
    capture_decode_max_bs: int
    capture_prefill_max_tokens: int
    compile_buckets: tuple[int, ...]
    migration_generated_files: int
    migration_real_tree: bool
    verify_batch_sizes: tuple[int, ...] = ()
    """Requests in the speculative section's verify steps."""
    speculative_drafts: int = 3
    """Drafts per request (``k``) in a verify step."""
    mixed_shapes: tuple[tuple[int, int], ...] = ()
    """(running requests, prompt chunk tokens) of the speculative section's mixed extend steps."""
    eagle_drafts: tuple[int, ...] = ()
    """``k`` of the speculative section's EAGLE draft rows (batch 1; none: no draft rows)."""
    tp_presets: tuple[tuple[str, tuple[int, ...]], ...] = ()
    """(preset, tensor-parallel sizes) the ``tp`` section launches (sizes the machine lacks are skipped)."""
    tp_batch_sizes: tuple[int, ...] = (1, 32, 128)
    """Decode batch sizes of the ``tp`` section."""
    lifecycle_presets: tuple[str, ...] = ()
    """Model presets the ``lifecycle`` section starts, puts to sleep and wakes."""


PROFILES: dict[str, Profile] = {
    "full": Profile(
        presets=("qwen3-0.6b", "llama-3.2-1b"),
        batch_sizes=(1, 8, 32, 128, 256),
        context_len=128,
        iterations=Iterations(warmup=10, timed=100),
        prefill_shapes=((1, 16), (1, 64), (1, 256), (1, 1024), (8, 64)),
        capture_decode_max_bs=256,
        capture_prefill_max_tokens=2048,
        compile_buckets=(1, 8, 32),
        migration_generated_files=1500,
        migration_real_tree=True,
        verify_batch_sizes=(1, 8, 32),
        speculative_drafts=3,
        mixed_shapes=((8, 48), (32, 96)),
        eagle_drafts=(3, 5),
        # TP=8 rows are "Not measured" on a machine of fewer GPUs: the 70B comparison and Qwen3-32B need eight.
        tp_presets=(("llama-3-8b", (1, 2, 4)), ("llama-3-70b", (4, 8)), ("qwen3-32b", (8,))),
        tp_batch_sizes=(1, 32, 128),
        lifecycle_presets=("qwen3-0.6b", "llama-3-8b"),
    ),
    "quick": Profile(
        presets=("qwen3-0.6b",),
        batch_sizes=(1, 32),
        context_len=128,
        iterations=Iterations(warmup=3, timed=20),
        prefill_shapes=((1, 64), (8, 64)),
        capture_decode_max_bs=32,
        capture_prefill_max_tokens=256,
        compile_buckets=(1, 8),
        migration_generated_files=200,
        migration_real_tree=False,
        verify_batch_sizes=(1, 8),
        speculative_drafts=3,
        mixed_shapes=((8, 48),),
        eagle_drafts=(3,),
        tp_presets=(("llama-3-8b", (1, 2)),),
        tp_batch_sizes=(1, 32),
        lifecycle_presets=("qwen3-0.6b",),
    ),
}
"""Profile name -> profile (``--quick`` picks ``quick``)."""
