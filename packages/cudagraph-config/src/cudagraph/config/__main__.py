"""``python -m cudagraph.config``: see ``cudagraph.config.cli``."""

import sys

from .cli import main

sys.exit(main())
