"""Bytes on disk: the ledger file framing, the segment codec, the bucket snapshot, the file layer.

Owns everything a reader in another language would need to implement (see ``formats/``):
``ledger_file`` (header, CRC-framed entries, trailer; write-fsync-rename), ``segment_codec``
(one sorted run of indexes as compact columns), ``snapshot`` (entry 0's metadata, segmentation,
``BucketFile``; its per-ledger bitmaps in ``bucket_bitmaps``), ``catalog_codec`` (the catalog's keys
and values) and ``bucket_summary`` (the catalog's summary of a bucket, with its first rows), ``journal_codec`` (a journal file's header, group framing
and records), and ``fs`` (the one seam every durable write, fsync, rename and unlink passes).

May import: the root leaves (``bucketstore.errors``) and the core dependencies. Nothing above it.
"""
