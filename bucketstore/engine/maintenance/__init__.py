"""Seals and merges as jobs: what each writes, when they run, the worker that runs them off the
tracker's lock, and the backlog budget that bounds what waits for them.

May import: ``bucketstore.format``, ``bucketstore.memory``, the root leaves, and the engine's stages
below it: ``threads``, ``directory``, ``catalog``, ``queue``, ``durability``, ``buckets``,
``mutable``.
"""
