"""``python -m jupyter_pause.cli``: the same as the ``jupyter pause`` command."""

import sys

from .main import main

sys.exit(main())
