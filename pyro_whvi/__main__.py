"""``python -m pyro_whvi``: the ``whvi`` command line."""

import sys

from .experiments.cli import main

sys.exit(main())
