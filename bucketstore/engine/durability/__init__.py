"""Journal mode's write-ahead log, the at-least-once handoff of delivered batches, and the copy
of a live journal.

May import: ``bucketstore.format``, ``bucketstore.memory``, the root leaves, and the engine's stages
below it: ``threads``, ``directory``, ``catalog``, ``queue``.
"""
