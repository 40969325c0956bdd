"""Stand-in of the legacy SGLang API for the plugin tests: SGLang 0.5.13's names and signatures, the GPU work faked.

Written for ``tests/codemods/test_plugins.py`` only; nothing here is SGLang's code. Importable as ``sglang...`` when
``tests/codemods/plugins/legacy_api`` is on the path.
"""

from sglang.srt.entrypoints.engine import Engine
from sglang.srt.server_args import ServerArgs

__all__ = ["Engine", "ServerArgs"]
