"""One delayed-delivery tracker: adds, delivery, its side of seals and merges, recovery at
open, and the services it takes from its store.

May import: ``bucketstore.format``, ``bucketstore.memory``, the root leaves, and the engine's stages
below it: ``threads``, ``directory``, ``catalog``, ``queue``, ``durability``, ``buckets``,
``mutable``, ``maintenance``.
"""
