"""FlashInfer's private attributes on the device: a graph decode wrapper the FlashInfer backend made and planned has
every attribute ``kernels.flashinfer.private_api`` reads, holds the shared pinned workspace the adapter gave it, and
its bound launch is the direct kernel call (not ``wrapper.run``). A FlashInfer that moves one fails here, naming it."""

from __future__ import annotations

import pytest
import torch
from test_gpu_engine_graphs import EAGER, FLASHINFER_MODEL, NO_FLASHINFER, decode_batch_of_lengths, engine

# kernels.flashinfer.decode_attention imports FlashInfer itself: without it there is nothing to collect.
pytest.importorskip(
    "flashinfer", reason="pip install flashinfer-python (or carry .whl) to check FlashInfer's private attributes"
)

from cudagraph.engine.kernels.flashinfer.decode_attention import bind_decode_run
from cudagraph.engine.kernels.flashinfer.private_api import (
    DECODE_WRAPPER_ATTRIBUTES,
    PINNED_WORKSPACE,
    PROVEN_RANGE,
    direct_decode_launch,
    in_proven_range,
    installed_version,
    read_private,
)
from cudagraph.runner import ReplayMetadata

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        NO_FLASHINFER, reason="pip install flashinfer-python (or carry .whl) to check FlashInfer's private attributes"
    ),
]


def test_a_planned_graph_wrapper_has_every_private_attribute_the_adapter_reads() -> None:
    assert in_proven_range(installed_version()), f"flashinfer {installed_version()} is outside {PROVEN_RANGE}"
    with engine(FLASHINFER_MODEL, EAGER, attention="flashinfer", dtype="bfloat16") as flash:
        attn_backend = flash.attn_backend
        batch = decode_batch_of_lengths(flash, [5, 17, 33], seed=0)
        attn_backend.init_forward_metadata_replay_cuda_graph(ReplayMetadata.of_batch(batch))
        wrapper = attn_backend.decode_wrapper.wrapper
        settings = read_private(wrapper, [attr.name for attr in DECODE_WRAPPER_ATTRIBUTES])  # raises naming any missing
        assert settings[PINNED_WORKSPACE] is attn_backend._workspaces.pinned_int_buffer
        shape = flash.shape
        q = torch.randn(batch.batch_size, shape.num_heads, shape.head_dim, device="cuda", dtype=torch.bfloat16)
        out = torch.empty_like(q)
        paged_kv = attn_backend._paged_kv(0)
        assert direct_decode_launch(wrapper, q, paged_kv, out) is not None, "the plain graph wrapper binds directly"
        bound = bind_decode_run(wrapper, q, paged_kv, out)
        bound()
        want = wrapper.run(q, paged_kv)
        torch.testing.assert_close(out, want, rtol=0, atol=0)
