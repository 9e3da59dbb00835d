"""The source articles' compact in-memory structures, each usable on its own.

``inmemory`` (Pulsar's heap of triples, the benchmarks' baseline), ``timebucket`` (seed 000's
TimeBucket index) and ``timebucket_tracker``, ``nack`` (seed 002's negative-ack tracker) and
``dedup`` (seed 003's two-generation roaring de-duplicator, snapshotted as a ledger file).

May import: ``bucketstore.format`` (for the de-duplicator's snapshot) and the root leaves.
"""
