"""SGLang's offline engine (stand-in): only how it turns keyword arguments into server arguments."""

from sglang.srt.server_args import ServerArgs


class Engine:
    """``sglang.Engine(**kwargs)``: the keyword arguments are server arguments (``server_args=`` passes them whole)."""

    server_args_class = ServerArgs

    def __init__(self, **kwargs):
        self.server_args = kwargs["server_args"] if "server_args" in kwargs else self.server_args_class(**kwargs)
