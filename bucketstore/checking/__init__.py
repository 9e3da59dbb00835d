"""Offline checking and inspection of stores and ledger files: the engine's fsck, as a library.

``ledger_check`` checks one ledger file completely (every CRC, order, bound, bitmap and count)
and reports every problem as a typed finding; ``store_check`` reads a whole store as one
consistent view (catalog against ledger and journal files, beside a live writer or not) for
checking and for the ``catalog``/``stats`` overviews. Nothing here writes: repairs are what
``open`` does by itself and what ``engine.rebuild`` does when asked.

May import: the root leaves, ``format``, ``memory`` and ``engine``. Imported by ``cli`` (which only
parses arguments and prints), ``testing``, ``spark`` and the package root. Never prints.
"""
