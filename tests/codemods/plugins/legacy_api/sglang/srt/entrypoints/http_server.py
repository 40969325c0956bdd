"""SGLang's HTTP server (stand-in): only the names it imports for its own use, which code imports from it in turn."""

from sglang.srt.entrypoints.engine import Engine
from sglang.srt.server_args import ServerArgs

__all__ = ["Engine", "ServerArgs"]
