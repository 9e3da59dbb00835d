"""The LMDB catalog: bucket keys and cursor properties per tracker, the checks made before LMDB
maps a file, and the gate that grows its map.

May import: ``bucketstore.format``, ``bucketstore.memory``, the root leaves, and the engine's stages
below it: ``threads``, ``directory``.
"""
