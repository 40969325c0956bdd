"""The platform's graph object (what ``torch.npu.NPUGraph`` is on the device; faked on the CPU)."""


class NPUGraph:
    """A platform graph: capture binds the function, its pool and stream; replay runs it again."""

    def __init__(self):
        self.captured = None
        self.pool = None
        self.auto_dispatch_capture = False
        self.replays = 0

    def capture(self, run_once_fn, *, pool=None, stream=None, auto_dispatch_capture=False):
        """Bind ``run_once_fn`` as what this graph replays."""
        self.captured = run_once_fn
        self.pool = pool
        self.auto_dispatch_capture = auto_dispatch_capture

    def replay(self):
        """Run what was captured."""
        self.replays += 1
        return self.captured()
