"""The crash-testing kit: fault injection and crash-point machinery for the engine and embedders.

``faults`` is a drop-in file layer that numbers every durable call, crashes before any of them,
fails them with EIO/ENOSPC or short writes, and builds what a crash could leave on disk.

May import: the whole product. Nothing in the product imports it.
"""
