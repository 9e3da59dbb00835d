"""The storage engine: store, catalog, trackers, buckets, shared queue, merge and journal.

The data flow: ``tracker`` (its methods live by job in ``adding``, ``delivery``, ``job_runner``,
``lazy_open`` and ``recovery``) takes an index into ``mutable_bucket`` (or ``mutable_timebucket``);
a ledger roll seals it through ``format.snapshot`` into a ledger file registered in
``catalog``; ``sealed_bucket`` reads one segment at a time into ``shared_queue`` (its items,
runs and slots, in ``queue_runs``), from which
``get_scheduled_messages`` delivers (``read_ahead`` reads a bucket's next segment on the store's
reader thread once its loaded one runs low). ``index_set`` is the tracker-wide set of what is tracked,
``merge`` picks adjacent buckets to merge; the seals and merges run as ``seal_pipeline`` and
``merge_pipeline`` jobs (their common life, and ``JobHost``, all they see of the tracker, in
``bucket_job``; the rows still live in ``liveness``)
on the store's ``maintenance`` worker, the tracker's lock held only to freeze and to install
(``worker_thread`` is the queue-and-thread both it and ``read_ahead``'s reader are built on).
``handoff`` holds delivered batches until the embedder confirms them; ``journal`` is the write-ahead log of
``durability="journal"``, and ``store`` owns the directory, its lock and its trackers. A tracker
gets only ``store_services`` from its store (catalog, ledger directory, id allocator), so
``store`` -> ``tracker`` -> ``store_services`` has no cycle. ``identity`` checks that a ledger
file is the one its catalog entry names, ``lmdb_file`` checks ``data.mdb`` before LMDB maps it,
``rebuild`` rebuilds a lost catalog from the files' headers, ``store_lock`` owns ``STORE/LOCK``
for the writer, the rebuild and the readers, and ``checkpoint`` copies a live store (its
journals through ``journal_copy``). ``disk_usage`` counts a live store's files and bytes for
``stats()`` and the metrics, leaving out a file retired between the listing and its stat.

May import: ``bucketstore.format``, ``bucketstore.memory`` and the root leaves. Never the CLI,
Spark or ``bucketstore.testing``.
"""
