"""The store: its directory, trackers and topics, read-only handles, checkpoints, upgrades and
a lost catalog's rebuild.

May import: ``bucketstore.format``, ``bucketstore.memory``, the root leaves, and the engine's stages
below it: ``threads``, ``directory``, ``catalog``, ``queue``, ``durability``, ``buckets``,
``mutable``, ``maintenance``, ``tracker``, ``topics``.
"""
