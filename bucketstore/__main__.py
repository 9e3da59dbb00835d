"""``python -m bucketstore``: the same command line as the ``bucketstore`` script."""

import sys

from .cli import main

sys.exit(main())
