"""The storage engine: store, catalog, trackers, buckets, shared queue, merge and journal.

The data flow: ``tracker`` takes an index into ``mutable_bucket`` (or ``mutable_timebucket``);
a ledger roll seals it through ``format.snapshot`` into a ledger file registered in
``catalog``; ``sealed_bucket`` reads one segment at a time into ``shared_queue``, from which
``get_scheduled_messages`` delivers. ``index_set`` is the tracker-wide set of what is tracked,
``merge`` picks and rewrites adjacent buckets, ``journal`` is the write-ahead log of
``durability="journal"``, and ``store`` owns the directory, its lock and its trackers. A tracker
gets only ``store_services`` from its store (catalog, ledger directory, id allocator), so
``store`` -> ``tracker`` -> ``store_services`` has no cycle.

May import: ``bucketstore.format``, ``bucketstore.memory`` and the root leaves. Never the CLI,
Spark or ``bucketstore.testing``.
"""
