"""``python -m cudagraph.config``: see ``cudagraph.config.resolve_command``."""

import sys

from .resolve_command import main

sys.exit(main())
