"""Threads the engine runs work on: the queue-and-thread base of the maintenance worker and of
the read-ahead reader, and one call run beside its caller.

May import: ``bucketstore.format``, ``bucketstore.memory``, the root leaves; no other stage of the
engine.
"""
