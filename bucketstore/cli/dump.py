"""What ``bucketstore dump`` shows about a ledger file, as data and as text.

:func:`describe_file` reads as much of a file as can be trusted into a plain
dict (JSON-ready: ints, strings, lists), stopping at the first damage and
recording it under ``"error"``; :func:`render_text` lays that dict out for a
terminal in the manner of ``sst_dump`` and ``parquet-tools meta``. Keeping the
two apart means ``--json`` and the text view can never disagree.
"""

from __future__ import annotations

import os
from typing import Any

from pyroaring import BitMap64

from ..errors import CorruptLedgerError
from ..format.entry_lists import COUNTS_ONLY_VERSION
from ..format.ledger_file import END_MAGIC, MAGIC, LedgerReader
from ..format.segment_codec import FLAG_GROUPED, FLAG_ZLIB, FLAG_ZSTD
from ..format.snapshot import BucketFile

__all__ = ["describe_file", "render_text", "looks_like_ledger"]


def looks_like_ledger(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is meant to be a ledger file, damaged or not.

    A file with the ledger magic at its start or the end magic at its end, or
    named ``*.ledger`` / ``*.ledger.tmp`` (a zeroed or truncated ledger keeps
    its name), is a ledger whose problems are damage; anything else (a text
    file, a catalog's data.mdb) is not a ledger at all, which is the caller's
    mistake rather than the disk's.
    """
    return named_or_marked(path, (".ledger", ".ledger.tmp"), MAGIC, END_MAGIC)


def named_or_marked(path: str | os.PathLike[str], suffixes: tuple[str, ...], magic: bytes, end_magic: bytes) -> bool:
    """Whether ``path`` ends with one of ``suffixes`` (its name survives a zeroed or truncated
    file), or starts with ``magic`` or ends with ``end_magic``."""
    name = os.fspath(path)
    if name.endswith(suffixes):
        return True
    with open(name, "rb") as f:
        head = f.read(len(magic))
        size = f.seek(0, os.SEEK_END)
        f.seek(max(0, size - len(end_magic)))
        tail = f.read(len(end_magic))
    return head == magic or tail == end_magic


def describe_file(path: str | os.PathLike[str], indexes: int = 0) -> dict[str, Any]:
    """Describe a ledger file: header, properties and, for a bucket, entry 0 and its segments.

    :param indexes: how many leading indexes of each segment to include.
    :return: a dict; ``doc["error"]`` is ``None`` or ``{"offset", "message"}``
        for the damage that stopped the reading. Everything read before the
        damage is present.
    :raises FileNotFoundError: ``path`` does not exist.
    """
    doc: dict[str, Any] = {"path": os.fspath(path), "error": None}
    try:
        with LedgerReader(path) as reader:
            doc.update(ledger_id=reader.ledger_id, format_version=reader.version, size=reader.size,
                       entry_count=reader.entry_count, properties=dict(sorted(reader.properties.items())))
            if reader.properties.get("kind") != "bucket":
                doc["entries"] = [{"entry": k, "offset": reader.entry_offset(k), "size": reader.entry_size(k)}
                                  for k in range(reader.entry_count)]
                return doc
        with BucketFile(path) as bucket:
            _describe_bucket(bucket, indexes, doc)
    except CorruptLedgerError as exc:
        doc["error"] = {"offset": exc.offset, "message": exc.reason}
    except FileNotFoundError:
        raise
    except OSError as exc:
        doc["error"] = {"offset": 0, "message": f"cannot read: {exc.strerror or exc}"}
    return doc


def _describe_bucket(bucket: BucketFile, indexes: int, doc: dict[str, Any]) -> None:
    meta = bucket.metadata
    # (Asked before the bitmaps are read: once loaded as bitmaps, the lists are let go.)
    lists = getattr(meta.bitmaps, "lists", None)
    doc["bucket"] = {"snapshot_version": meta.version, "start_ledger": meta.start_ledger,
                     "end_ledger": meta.end_ledger, "count": meta.count, "metadata_size": bucket.metadata_size,
                     # Version 2 keeps one bitmap per ledger for the bucket (version 1: per segment, below).
                     "ledgers": _ledger_docs(meta.bitmaps)}
    if meta.version >= 4 and lists is not None:
        # Version 4 stores array-only ledgers as entry-id lists (version 5: their counts, the ids
        # being the segments' rows), the others as portable bitmaps.
        doc["bucket"]["listed_ledgers"] = len(lists.ledgers)
    segments: list[dict[str, Any]] = []
    doc["segments"] = segments
    for number, seg_meta in enumerate(meta.segments, start=1):
        size = bucket.ledger.entry_size(number)
        entry = {
            "segment": number,
            "offset": bucket.ledger.entry_offset(number),
            "min_timestamp": seg_meta.min_timestamp,
            "max_timestamp": seg_meta.max_timestamp,
            "count": seg_meta.count,
            "size": size,
        }
        if meta.version == 1:
            entry["ledgers"] = _ledger_docs(seg_meta.bitmaps)
        segments.append(entry)
        # Reading the segment checks its CRC and decodes it; a dump that does
        # not read it would present a damaged segment as sound.
        seg = bucket.read_segment(number)
        flags = bucket.ledger.read_entry(number)[0]
        entry["compressed"] = bool(flags & (FLAG_ZLIB | FLAG_ZSTD))
        entry["codec"] = "zstd" if flags & FLAG_ZSTD else "zlib" if flags & FLAG_ZLIB else "none"
        # Version 6: rows stored ledger by ledger (no ledger column) or in delivery order.
        entry["layout"] = "grouped" if flags & FLAG_GROUPED else "rows"
        if indexes:
            k = min(indexes, len(seg))
            entry["indexes"] = [list(row) for row in zip(seg.timestamps[:k].tolist(), seg.ledger_ids[:k].tolist(),
                                                         seg.entry_ids[:k].tolist())]


def _ledger_docs(bitmaps: dict) -> list[dict[str, Any]]:
    return [{"ledger_id": ledger, "cardinality": len(bm), "width": 64 if isinstance(bm, BitMap64) else 32}
            for ledger, bm in sorted(bitmaps.items())]


def _ledger_text(ledgers: list[dict[str, Any]]) -> str:
    return " ".join(f"{lg['ledger_id']}:{lg['cardinality']}" + ("/64" if lg["width"] == 64 else "") for lg in ledgers)


def render_text(doc: dict[str, Any]) -> str:
    """The terminal view of :func:`describe_file`'s dict."""
    lines = [f"file        {doc['path']}"]
    if "ledger_id" in doc:
        lines += [f"ledger id   {doc['ledger_id']}",
                  f"format      ledger v{doc['format_version']}",
                  f"size        {doc['size']} bytes",
                  f"entries     {doc['entry_count']}",
                  "properties"]
        width = max((len(k) for k in doc["properties"]), default=0)
        lines += [f"  {k:<{width}} = {v}" for k, v in doc["properties"].items()]
    for entry in doc.get("entries", []):
        lines.append(f"entry {entry['entry']:>6}  offset {entry['offset']}  {entry['size']} bytes")
    if "bucket" in doc:
        b = doc["bucket"]
        lines.append(f"bucket      snapshot v{b['snapshot_version']}, ledgers [{b['start_ledger']}, "
                     f"{b['end_ledger']}], {b['count']} indexes in {len(doc['segments'])} segments, "
                     f"entry 0 {b['metadata_size']} bytes")
        if "listed_ledgers" in b:
            # Version 5 lists the ledgers and their counts; their entry ids are the segments' rows.
            listed = ("entry-id lists" if b["snapshot_version"] < COUNTS_ONLY_VERSION
                      else "counts (ids: the segments' rows)")
            lines.append(f"entry 0     {b['listed_ledgers']} ledgers as {listed}, "
                         f"{len(b['ledgers']) - b['listed_ledgers']} as bitmaps")
        if b["snapshot_version"] >= 2:
            lines.append(f"ledgers     {_ledger_text(b['ledgers'])}")
    if doc.get("segments"):
        lines.append(f"{'segment':>7} {'min_timestamp':>20} {'max_timestamp':>20} {'count':>8} {'bytes(z)':>8} "
                     f"{'B/idx':>6}  " + ("ledgers (id:cardinality)" if any("ledgers" in seg for seg in doc["segments"])
                                        else "codec"))
    for seg in doc.get("segments", []):
        z = "z" if seg.get("compressed") else " "
        ledgers = _ledger_text(seg["ledgers"]) if "ledgers" in seg else seg.get("codec", "")
        if seg.get("layout") == "grouped":
            ledgers += ", grouped"
        lines.append(f"{seg['segment']:>7} {seg['min_timestamp']:>20} {seg['max_timestamp']:>20} "
                     f"{seg['count']:>8} {seg['size']:>7}{z} {seg['size'] / seg['count']:>6.2f}  {ledgers}")
        for ts, ledger, entry in seg.get("indexes", []):
            lines.append(f"{'':>8}{ts:>20}  {ledger}:{entry}")
    if doc["error"] is not None:
        lines.append(f"DAMAGE      offset {doc['error']['offset']}: {doc['error']['message']}")
    return "\n".join(lines)
