"""The shared queue that delivery pops from, and the tracker-wide index of what is tracked.

May import: ``bucketstore.format``, ``bucketstore.memory``, the root leaves, and the engine's stages
below it: ``threads``, ``directory``, ``catalog``.
"""
