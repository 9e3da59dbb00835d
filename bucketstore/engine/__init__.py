"""The storage engine, one subpackage per stage of the data flow, lowest first:

``threads``
    ``worker_thread`` (the queue-and-thread under the maintenance worker and the read-ahead
    reader) and ``side_thread`` (one call run beside its caller).
``directory``
    The store directory as files: ``store_lock`` (``STORE/LOCK``, one writer), ``identity``
    (is a ledger file the one its catalog entry names?), ``disk_usage`` (bytes of a live store).
``catalog``
    The LMDB catalog (``catalog``), the checks made before LMDB maps ``data.mdb``
    (``lmdb_file``) and the gate that grows its map (``map_gate``).
``queue``
    ``shared_queue`` (one queue for every bucket's loaded segment, its runs and slots in
    ``queue_runs``), ``index_set`` (the tracker-wide set of what is tracked) and ``liveness``
    (a frozen view of it for work done off the lock).
``durability``
    ``journal`` (the write-ahead log of ``durability="journal"``), ``handoff`` (delivered
    batches held until confirmed) and ``journal_copy``.
``buckets``
    Sealed buckets as the tracker sees them: ``sealed_bucket`` (a ledger file read one segment
    at a time), ``sealed_membership`` (membership left on disk until asked), ``lazy_open``,
    ``read_ahead``, ``bucket_prefix`` (the first rows kept in the catalog) and ``index_pager``.
``mutable``
    ``mutable_bucket`` (and ``mutable_timebucket``): where adds land until a ledger roll.
``maintenance``
    Seals (``seal_pipeline``) and merges (``merge`` picks, ``merge_pipeline`` writes) as jobs
    with a common life (``bucket_job``), run by the ``maintenance`` worker off the tracker's
    lock; ``backlog_budget`` bounds the rows that wait for them.
``tracker``
    ``tracker``: one delayed-delivery tracker, its methods by job in ``adding``, ``delivery``
    (and ``delivery_rollback``), ``job_runner`` (its side of seals and merges) and ``recovery``;
    ``store_services`` is all it takes from its store, ``op_stats`` its counters.
``topics``
    One index per topic shared by every subscription: ``topic``, ``subscription`` (and its
    ``subscription_state``), the rows and windows it delivers from (``topic_rows``,
    ``topic_windows``), ``topic_file``, ``topic_registry``, ``topic_reader``, ``topic_figures``.
``store``
    ``store`` owns the directory, its lock, trackers and topics; ``read_only`` handles,
    ``checkpoint`` (a copy of a live store), ``upgrade``, ``rebuild`` (a lost catalog from the
    files' headers) and ``tracker_registry``.

An index travels up this list: ``tracker`` takes it into ``mutable``; a ledger roll seals it
(``maintenance``, through ``format.snapshot``) into a ledger file registered in ``catalog``;
``buckets`` reads one segment at a time into ``queue``, from which the tracker delivers, through
``durability``'s handoff in journal mode.

May import: ``bucketstore.format``, ``bucketstore.memory`` and the root leaves. Never the CLI,
Spark or ``bucketstore.testing``. Inside, a stage imports only the stages above it in this list
(``tests/docs/test_architecture.py`` holds both rules).
"""
