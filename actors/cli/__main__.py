"""``python -m actors.cli``: the ``pgrouter`` command."""

import sys

from actors.cli import main

sys.exit(main())
