"""``python -m harness`` (with ``bench/`` on the path): the harness command line."""

import sys

from harness.cli import main

sys.exit(main(sys.argv[1:]))
