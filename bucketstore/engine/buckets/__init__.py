"""Sealed buckets as the tracker sees them: a ledger file read one segment at a time, their
membership on disk, lazy open, read-ahead, the paging of the tracker-wide index.

May import: ``bucketstore.format``, ``bucketstore.memory``, the root leaves, and the engine's stages
below it: ``threads``, ``directory``, ``catalog``, ``queue``, ``durability``.
"""
