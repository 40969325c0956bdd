"""``python -m cudagraph.engine``: the ``cudagraph-engine`` command line."""

import sys

from .commands import main

sys.exit(main())
