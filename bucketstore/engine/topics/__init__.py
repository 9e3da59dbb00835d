"""Topics: one index per topic, shared by every subscription, each subscription's state and
its delivery.

May import: ``bucketstore.format``, ``bucketstore.memory``, the root leaves, and the engine's stages
below it: ``threads``, ``directory``, ``catalog``, ``queue``, ``durability``, ``buckets``,
``mutable``, ``maintenance``, ``tracker``.
"""
