"""The ``bucketstore`` command line: dump, verify, catalog, stats and simulate.

``commands`` parses arguments and maps errors to exit codes (0 ok, 1 damage, 2 usage), ``dump`` and
``verify`` read single files, ``store_check`` reads a whole store, ``simulate`` is the main job.

May import: the root leaves, ``format``, ``memory`` and ``engine`` (``verify`` loads de-duplicator
snapshots through ``memory.dedup``). Never ``bucketstore.testing`` or ``bucketstore.spark``.
"""

from .commands import main

__all__ = ["main"]
