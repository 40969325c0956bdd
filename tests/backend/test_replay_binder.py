"""A break op's replay binder: bound once at capture, called at replay instead of the op (checked on the CPU through
the breakable test double, which records breaks as ``BreakableCUDAGraph`` does)."""

from __future__ import annotations

import functools

import pytest
import torch

from cudagraph.backend.testing import CpuReplayBackend
from cudagraph.backend_utils import (
    CaptureOptions,
    EagerCall,
    ForwardContext,
    ForwardContextScope,
    break_options,
    get_forward_context,
    register_break_op,
    set_forward_context,
    unregister_break_op,
)

_LIBRARY = torch.library.Library("cudagraph_replay_binder_test", "DEF")
_LIBRARY.define("shift_(Tensor(a!) x) -> ()")
_LIBRARY.define("shifted(Tensor x) -> Tensor")
SHIFT = {"value": 1.0}
"""Per-step state the op (and its bound form) reads at call time, as attention reads its planned metadata."""
OP_CALLS = {"shift_": 0, "shifted": 0}


def _shift_(x: torch.Tensor) -> None:
    OP_CALLS["shift_"] += 1
    x.add_(SHIFT["value"])


def _shifted(x: torch.Tensor) -> torch.Tensor:
    OP_CALLS["shifted"] += 1
    return x + SHIFT["value"]


_LIBRARY.impl("shift_", _shift_, "CompositeExplicitAutograd")
_LIBRARY.impl("shifted", _shifted, "CompositeExplicitAutograd")
SHIFT_ = torch.ops.cudagraph_replay_binder_test.shift_
SHIFTED = torch.ops.cudagraph_replay_binder_test.shifted


class Binder:
    """Records what it was bound with; binds ``x.add_(SHIFT)`` (or a new tensor, for the returning op)."""

    def __init__(self, *, returns: bool = False, decline: bool = False) -> None:
        self.bound_with: list[tuple[torch.Tensor, ...]] = []
        self.bound_calls = 0
        self.returns = returns
        self.decline = decline

    def __call__(self, x: torch.Tensor):
        self.bound_with.append((x,))
        if self.decline:
            return None
        return functools.partial(self.run_returning if self.returns else self.run_in_place, x)

    def run_in_place(self, x: torch.Tensor) -> None:
        self.bound_calls += 1
        x.add_(SHIFT["value"])

    def run_returning(self, x: torch.Tensor) -> torch.Tensor:
        self.bound_calls += 1
        return x + SHIFT["value"]


@pytest.fixture(autouse=True)
def clean_state():
    SHIFT["value"] = 1.0
    OP_CALLS.update(shift_=0, shifted=0)
    yield
    unregister_break_op(SHIFT_)
    unregister_break_op(SHIFTED)


def capture(forward) -> CpuReplayBackend:
    backend = CpuReplayBackend("breakable", options=CaptureOptions(num_warmups=0))
    with backend.capture_session():
        backend.capture_one(4, forward)
    return backend


def test_registering_a_binder_keeps_it_with_the_op() -> None:
    binder = Binder()
    register_break_op(SHIFT_, replay_binder=binder)
    options = break_options(SHIFT_.default)
    assert options is not None and options.replay_binder is binder


def test_a_bound_break_replays_its_callable_not_the_op_and_reads_state_at_replay() -> None:
    binder = Binder()
    register_break_op(SHIFT_, replay_binder=binder)
    static_x = torch.zeros(4)

    def forward() -> torch.Tensor:
        h = static_x * 2
        SHIFT_(h)
        return h.sin()

    backend = capture(forward)
    assert OP_CALLS["shift_"] == 1, "the op itself runs once, at capture"
    assert len(binder.bound_with) == 1 and binder.bound_calls == 0
    static_x.copy_(torch.arange(4.0))
    SHIFT["value"] = 5.0
    out = backend.replay(4)
    assert OP_CALLS["shift_"] == 1, "replay must not call the op"
    assert binder.bound_calls == 1
    torch.testing.assert_close(out, (torch.arange(4.0) * 2 + 5.0).sin())


def test_bound_and_dispatched_replays_agree_bit_for_bit() -> None:
    static_x = torch.zeros(4)

    def forward() -> torch.Tensor:
        h = static_x.cos()
        SHIFT_(h)
        return h * 3

    register_break_op(SHIFT_)
    dispatched = capture(forward)
    register_break_op(SHIFT_, replay_binder=Binder())
    bound = capture(forward)
    static_x.copy_(torch.linspace(-1, 1, 4))
    SHIFT["value"] = 0.25
    assert torch.equal(dispatched.replay(4).clone(), bound.replay(4))


def test_a_binder_that_declines_leaves_the_op_to_replay() -> None:
    binder = Binder(decline=True)
    register_break_op(SHIFT_, replay_binder=binder)
    static_x = torch.zeros(4)

    def forward() -> torch.Tensor:
        h = static_x + 1
        SHIFT_(h)
        return h

    backend = capture(forward)
    backend.replay(4)
    assert len(binder.bound_with) == 1 and OP_CALLS["shift_"] == 2


def test_a_bound_break_that_returns_a_tensor_is_copied_back() -> None:
    binder = Binder(returns=True)
    register_break_op(SHIFTED, replay_binder=binder)
    static_x = torch.zeros(4)

    def forward() -> torch.Tensor:
        return SHIFTED(static_x * 2) * 10

    backend = capture(forward)
    static_x.fill_(1.0)
    SHIFT["value"] = 3.0
    torch.testing.assert_close(backend.replay(4), torch.full((4,), 50.0))
    assert binder.bound_calls == 1 and OP_CALLS["shifted"] == 1


def test_eager_call_binds_the_bound_callable_itself() -> None:
    calls: list[str] = []

    def bound() -> None:
        calls.append("bound")

    call = EagerCall("op", lambda: calls.append("op"), (), {}, copy_back=(), bound=bound)
    assert call.bind() is bound
    call.bind()()
    assert calls == ["bound"]


def test_an_eager_call_reruns_on_the_step_arguments_and_refreshes_what_it_returned() -> None:
    def add(x: torch.Tensor, amount: float) -> torch.Tensor:
        return x + amount

    def add_(x: torch.Tensor, amount: float) -> torch.Tensor:
        return x.add_(amount)  # in place: returns its argument

    x = torch.zeros(3)
    captured = add(x, 1.0)
    call = EagerCall.record("add", add, (x, 1.0), {}, captured)
    assert call.copy_back == (captured,)
    call.rerun(torch.full((3,), 10.0), 5.0)  # this step's arguments, not the recorded (x, 1.0)
    torch.testing.assert_close(captured, torch.full((3,), 15.0))

    in_place = EagerCall.record("add_", add_, (x, 1.0), {}, add_(x, 1.0))
    assert in_place.copy_back == ()
    in_place.rerun(x, 2.0)  # nothing to refresh: the result is the argument
    torch.testing.assert_close(x, torch.full((3,), 3.0))


def test_a_forward_context_scope_is_reusable_and_restores_the_outer_context() -> None:
    outer, inner = ForwardContext(forward_batch="outer"), ForwardContext(forward_batch="inner")
    scope = ForwardContextScope(inner)
    with set_forward_context(outer):
        for _ in range(3):
            with scope as entered:
                assert entered is inner and get_forward_context() is inner
            assert get_forward_context() is outer


def test_a_forward_context_scope_cannot_be_entered_twice_at_once() -> None:
    scope = ForwardContextScope(ForwardContext())
    with scope, pytest.raises(RuntimeError, match="already entered"), scope:
        pass
