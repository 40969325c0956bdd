"""Stand-in of the legacy SGLang API for the plugin tests (names and signatures of SGLang 0.5.13, fake work)."""

from sglang.srt.server_args import ServerArgs


class Engine:
    """``sglang.Engine(**server_args)``: holds the server arguments it was built with."""

    def __init__(self, **kwargs):
        self.server_args = ServerArgs(**kwargs)
