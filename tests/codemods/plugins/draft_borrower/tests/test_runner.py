from types import SimpleNamespace

from draft_borrower.runner import DraftRunner


def _model_runner():
    return SimpleNamespace(
        server_args=SimpleNamespace(enable_cudagraph_gc=False), model=SimpleNamespace(forward=lambda *args: None)
    )


def test_capture_runs_the_borrowed_loop_on_the_draft_state():
    runner = DraftRunner(_model_runner(), [1, 2, 4])
    assert runner.capture() == [1, 2, 4]
    assert runner.captured == [4, 2, 1]  # the legacy loop captures the largest first
    assert runner.output_buffers[2] == {"logits": [0.0, 0.0]}
