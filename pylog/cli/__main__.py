"""``python -m pylog.cli``: the ``pylog`` command."""

import sys

from pylog.cli import main

sys.exit(main())
