"""``python -m router``: the same command line as ``pgrouter`` (the CLI itself lives in
``actors`` because it does I/O)."""

import sys

from actors.cli import main

sys.exit(main())
