"""``python -m pyro_whvi``: the ``whvi`` command line."""

import sys

from .cli import main

sys.exit(main())
