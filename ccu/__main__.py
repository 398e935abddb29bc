"""``python -m ccu``: the ``ccu`` command line (:mod:`ccu.cli`)."""

import sys

from ccu.cli import main

sys.exit(main())
