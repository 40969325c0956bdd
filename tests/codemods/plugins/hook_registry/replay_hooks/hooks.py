"""The plugin's hooks: a replay timer that reads the runner's device, and a capture counter on private methods."""

from replay_hooks.registry import around, resolve

RUNNER_CLASS = "sglang.srt.model_executor.cuda_graph_runner.CudaGraphRunner"
REPLAYS = []
CAPTURES = []


@around("sglang.srt.model_executor.cuda_graph_runner.CudaGraphRunner.replay")
def time_replay(replay, runner, forward_batch, **kwargs):
    """Record where each replay ran, synchronising the runner's device first as a timer would."""
    runner.device_module.synchronize()
    REPLAYS.append((runner.device, forward_batch.batch_size))
    return replay(runner, forward_batch, **kwargs)


def patch_private_capture():
    """Count the graphs the runner captures, through its private hooks; returns an undo function."""
    undos = []
    for target in (f"{RUNNER_CLASS}._capture_graph", RUNNER_CLASS + "._create_device_graph"):
        owner, method = resolve(target)
        original = getattr(owner, method)

        def counting(self, *args, _original=original, _method=method, **kwargs):
            CAPTURES.append(_method)
            return _original(self, *args, **kwargs)

        setattr(owner, method, counting)
        undos.append((owner, method, original))

    def undo():
        for owner, method, original in undos:
            setattr(owner, method, original)

    return undo
