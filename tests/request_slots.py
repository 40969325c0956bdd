"""Holding a request's place in an engine's KV cache, for tests that build batches by hand: what the engine's
scheduler does when it admits a request (a request row, KV slots for its whole budget, the row pointing at them)."""

from __future__ import annotations

from cudagraph.engine.batch import Request
from cudagraph.engine.model_runner import ModelRunner


def hold_slots(model_runner: ModelRunner, request: Request) -> Request:
    """Give ``request`` a request row and KV slots for its whole budget, written into the row; returns it."""
    request.req_pool_index = model_runner.req_to_token_pool.alloc()
    request.kv_slots = model_runner.token_to_kv_pool.alloc(request.budget)
    model_runner.req_to_token_pool.write(request.req_pool_index, 0, request.kv_slots)
    return request
