"""The ``bucketstore`` command line: dump, verify, catalog, stats and simulate.

``commands`` parses arguments and maps errors to exit codes (0 ok, 1 damage, 2 usage), ``dump`` and
``verify`` read single files, ``store_check`` reads a whole store, ``simulate`` is the main job.

May import: everything in the product except ``bucketstore.testing`` and ``bucketstore.spark``.
"""

from .commands import main

__all__ = ["main"]
