"""The mutable bucket: where adds land until a ledger roll seals them.

May import: ``bucketstore.format``, ``bucketstore.memory``, the root leaves, and the engine's stages
below it: ``threads``, ``directory``, ``catalog``, ``queue``, ``durability``, ``buckets``.
"""
