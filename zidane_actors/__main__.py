"""``python -m zidane_actors``: the ``zidane-actors`` command line."""

import sys

from .cli import main

sys.exit(main())
