"""The store's directory as files: its single-writer lock, which ledger file belongs to which
catalog entry, and the bytes its directories hold.

May import: ``bucketstore.format``, ``bucketstore.memory``, the root leaves, and the engine's stages
below it: ``threads``.
"""
