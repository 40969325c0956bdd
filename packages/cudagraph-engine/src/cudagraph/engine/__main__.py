"""``python -m cudagraph.engine``: the ``cudagraph-engine`` command line."""

import sys

from .cli import main

sys.exit(main())
