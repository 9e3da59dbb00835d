"""What ``bucketstore dump`` shows about a topic's sealed run file (``formats/topic_runs.md``).

As :mod:`~bucketstore.cli.dump` does for ledger files: :func:`describe_run` reads as much of
the file as can be trusted into a plain dict, stopping at the first damage and recording it
under ``"error"`` (``{"offset", "message"}``); :func:`render_run_text` lays that dict out for a
terminal. Every part is checked as the engine checks it before use (header, trailer, directory
CRC, bitmaps, each segment's CRC and rows), so a dump never shows a damaged part as sound.
"""

from __future__ import annotations

import os
import re
from typing import Any, BinaryIO

from pyroaring import BitMap64

from ..format.topic_run import (END_MAGIC, HEADER, RUN_MAGIC, TRAILER, TopicRunError, decode_bitmaps,
                                decode_directory, decode_header, decode_segment, decode_trailer)
from .dump import named_or_marked

__all__ = ["looks_like_run", "describe_run", "render_run_text"]

_AT = re.compile(r"at offset (\d+): (.*)", re.DOTALL)


def looks_like_run(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is meant to be a topic run file, damaged or not: named ``*.run`` or
    ``*.run.tmp`` (a zeroed or truncated run keeps its name), or with the run's magic at its
    start or its end magic at its end."""
    return named_or_marked(path, (".run", ".run.tmp"), RUN_MAGIC, END_MAGIC)


def _read(f: BinaryIO, offset: int, length: int) -> bytes:
    f.seek(offset)
    return f.read(length)


def describe_run(path: str | os.PathLike[str], indexes: int = 0) -> dict[str, Any]:
    """Describe a run file: header, its ledgers (the bitmaps, as a bucket's entry 0 keeps them),
    and per segment its offset, size, rows and deliver_at range.

    :param indexes: how many leading rows of each segment to include, as
        ``[deliver_at, ledger, entry, seq]``.
    :raises FileNotFoundError: ``path`` does not exist.
    """
    doc: dict[str, Any] = {"path": os.fspath(path), "kind": "topic_run", "error": None}
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            doc["size"] = size
            header = _read(f, 0, HEADER.size)
            doc["topic_id"], doc["run_id"], doc["rows"] = decode_header(header)
            trailer = decode_trailer(_read(f, max(0, size - TRAILER.size), TRAILER.size), size)
            directory = decode_directory(header, _read(f, trailer[0], trailer[1]), trailer)
            segs = directory.segments
            doc["min_deliver_at"], doc["max_deliver_at"] = segs[0].first_ts, segs[-1].last_ts
            at, length, crc = directory.bitmaps
            bitmaps = decode_bitmaps(_read(f, at, length), at, crc)
            doc["bitmaps"] = {"offset": at, "size": length}
            doc["ledgers"] = [{"ledger_id": ledger, "cardinality": len(bm), "width": 64 if isinstance(bm, BitMap64)
                               else 32, "min_entry": bm.min(), "max_entry": bm.max()}
                              for ledger, bm in sorted(bitmaps.items())]
            segments: list[dict[str, Any]] = []
            doc["segments"] = segments
            for number, entry in enumerate(segs):
                seg = {"segment": number, "offset": entry.offset, "size": entry.length, "rows": entry.rows,
                       "min_deliver_at": entry.first_ts, "max_deliver_at": entry.last_ts}
                segments.append(seg)
                rows = decode_segment(_read(f, entry.offset, entry.length), entry)  # checks its CRC and rows
                seg["min_seq"], seg["max_seq"] = int(rows[:, 3].min()), int(rows[:, 3].max())
                if indexes:
                    seg["indexes"] = rows[:indexes].tolist()
    except TopicRunError as exc:
        found = _AT.match(str(exc))
        doc["error"] = ({"offset": int(found.group(1)), "message": found.group(2)} if found
                        else {"offset": 0, "message": str(exc)})
    except FileNotFoundError:
        raise
    except OSError as exc:
        doc["error"] = {"offset": 0, "message": f"cannot read: {exc.strerror or exc}"}
    return doc


def render_run_text(doc: dict[str, Any]) -> str:
    """The terminal view of :func:`describe_run`'s dict."""
    lines = [f"file        {doc['path']}"]
    if "topic_id" in doc:
        lines += ["format      topic run (formats/topic_runs.md)",
                  f"topic id    {doc['topic_id']}",
                  f"run id      {doc['run_id']}",
                  f"size        {doc['size']} bytes",
                  f"rows        {doc['rows']}"]
    if "min_deliver_at" in doc:
        lines.append(f"deliver_at  {doc['min_deliver_at']} .. {doc['max_deliver_at']}")
    if "ledgers" in doc:
        lines.append(f"bitmaps     offset {doc['bitmaps']['offset']}, {doc['bitmaps']['size']} bytes, "
                     f"{len(doc['ledgers'])} ledgers")
        lines.append(f"{'ledger':>20} {'entries':>8} {'min_entry':>12} {'max_entry':>12}")
        for lg in doc["ledgers"]:
            lines.append(f"{lg['ledger_id']:>20} {lg['cardinality']:>8} {lg['min_entry']:>12} {lg['max_entry']:>12}"
                         + ("  (64-bit)" if lg["width"] == 64 else ""))
    if doc.get("segments"):
        lines.append(f"{'segment':>7} {'offset':>10} {'bytes':>8} {'rows':>6} {'min_deliver_at':>20} "
                     f"{'max_deliver_at':>20} {'B/row':>6}")
    for seg in doc.get("segments", []):
        lines.append(f"{seg['segment']:>7} {seg['offset']:>10} {seg['size']:>8} {seg['rows']:>6} "
                     f"{seg['min_deliver_at']:>20} {seg['max_deliver_at']:>20} {seg['size'] / seg['rows']:>6.2f}")
        for ts, ledger, entry, seq in seg.get("indexes", []):
            lines.append(f"{'':>8}{ts:>20}  {ledger}:{entry}  seq {seq}")
    if doc["error"] is not None:
        lines.append(f"DAMAGE      {doc['path']}: at offset {doc['error']['offset']}: {doc['error']['message']}")
    return "\n".join(lines)
