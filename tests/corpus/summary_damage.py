"""Damaged catalog summaries: each a well-formed-looking summary with one field (or one fact) wrong.

A bucket summary (``formats/catalog.md``) is a catalog record, not a file, so its damage
is described as named changes (:data:`SUMMARY_CASES`) applied to a sound version-2
summary that keeps a prefix and at least two segments. ``make_damaged.py`` writes each
change applied to the golden ``formats/golden/summary_v2.bin`` as
``tests/corpus/damaged/<name>.summary``; the engine tests apply the same changes to a
live store's summary. Every case must be refused (a typed error) or read past (the
bucket's file is never deleted on its word).

The layout is decoded here from the spec's table, independently of
``bucketstore.format.bucket_summary``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

_HEADER = struct.Struct("<BQQQI")
_SEGMENT = struct.Struct("<QQQ")
_PREFIX = struct.Struct("<IQ")


def fields(raw: bytes) -> dict[str, Any]:
    """A version-2 summary's fields, as formats/catalog.md lays them out."""
    version, ledger_id, size, count, n = _HEADER.unpack_from(raw)
    segments = [list(_SEGMENT.unpack_from(raw, _HEADER.size + i * _SEGMENT.size)) for i in range(n)]
    at = _HEADER.size + n * _SEGMENT.size
    k, next_ts = _PREFIX.unpack_from(raw, at)
    cols = struct.unpack_from(f"<{3 * k}Q", raw, at + _PREFIX.size)
    return {"version": version, "ledger_id": ledger_id, "size": size, "count": count, "segments": segments,
            "next": next_ts, "rows": [list(r) for r in zip(cols[:k], cols[k:2 * k], cols[2 * k:])]}


def pack(f: dict[str, Any]) -> bytes:
    """The bytes of ``fields``' output (the prefix row count is the number of rows)."""
    out = _HEADER.pack(f["version"], f["ledger_id"], f["size"], f["count"], len(f["segments"]))
    out += b"".join(_SEGMENT.pack(*s) for s in f["segments"])
    rows = f["rows"]
    out += _PREFIX.pack(len(rows), f["next"])
    return out + struct.pack(f"<{3 * len(rows)}Q", *(r[0] for r in rows), *(r[1] for r in rows),
                             *(r[2] for r in rows))


def _change(edit: Callable[[dict[str, Any]], None]) -> Callable[[bytes], bytes]:
    def make(raw: bytes) -> bytes:
        f = fields(raw)
        assert f["version"] == 2 and len(f["segments"]) >= 2 and len(f["rows"]) >= 2, "needs a v2 summary with a prefix"
        edit(f)
        return pack(f)
    return make


def _set(**values: Any) -> Callable[[dict[str, Any]], None]:
    return lambda f: f.update(values)


def _add(name: str, delta: int) -> Callable[[dict[str, Any]], None]:
    return lambda f: f.update({name: f[name] + delta})


def _count(f: dict[str, Any]) -> None:
    f["count"] += 1
    f["segments"][-1][2] += 1  # the counts still add up: wrong only against the file


def _drop_segment(f: dict[str, Any]) -> None:
    f["count"] -= f["segments"].pop()[2]


def _no_segments(f: dict[str, Any]) -> None:
    f.update(count=0, segments=[], rows=[], next=0)  # looks like a bucket holding nothing


def _all_due(f: dict[str, Any]) -> None:
    for s in f["segments"]:
        s[0] = s[1] = 1  # every segment looks due at any clock (and behind any frontier)
    f.update(rows=[], next=0)


def _segment(number: int, column: int, delta: int) -> Callable[[dict[str, Any]], None]:
    def edit(f: dict[str, Any]) -> None:
        f["segments"][number][column] += delta
    return edit


def _move_a_count(f: dict[str, Any]) -> None:
    f["segments"][0][2] += 1
    f["segments"][-1][2] -= 1  # same total, wrong split


def _last_min(f: dict[str, Any]) -> None:
    s = f["segments"][-1]
    s[0] = s[1] if s[0] != s[1] else s[0] - 1


def _shorter_prefix(f: dict[str, Any]) -> None:
    f["rows"].pop()  # the next-row time is left as it was: now it names the wrong row


def _row(column: int, delta: int) -> Callable[[dict[str, Any]], None]:
    def edit(f: dict[str, Any]) -> None:
        f["rows"][-1][column] += delta
    return edit


#: name -> the change, applied to a sound summary's bytes.
SUMMARY_CASES: dict[str, Callable[[bytes], bytes]] = {
    "summary_version_1_with_prefix": _change(_set(version=1)),
    "summary_other_ledger": _change(_add("ledger_id", 1)),
    "summary_size": _change(_add("size", 1)),
    "summary_count": _change(_count),
    "summary_drops_a_segment": _change(_drop_segment),
    "summary_no_segments": _change(_no_segments),
    "summary_all_due": _change(_all_due),
    "summary_segment1_min": _change(_segment(0, 0, -1)),
    "summary_segment1_max": _change(_segment(0, 1, 1)),
    "summary_last_min": _change(_last_min),
    "summary_last_max": _change(_segment(-1, 1, 1)),
    "summary_counts_moved": _change(_move_a_count),
    "summary_prefix_shorter": _change(_shorter_prefix),
    "summary_prefix_next": _change(_add("next", 1)),
    "summary_prefix_time": _change(_row(0, 1)),
    "summary_prefix_ledger": _change(_row(1, 1)),
    "summary_prefix_entry": _change(_row(2, 1_000_000)),
}

#: Where each case is caught: ``refused`` as the summary is decoded (CatalogError naming the
#: key), ``entry 0`` when the bucket's entry 0 is read (before any use of the file, deletion
#: included), ``segment 1`` when segment 1 is read against the prefix.
CAUGHT_AT = {
    "summary_version_1_with_prefix": "refused",
    "summary_other_ledger": "refused",
    "summary_size": "entry 0",
    "summary_count": "entry 0",
    "summary_drops_a_segment": "entry 0",
    "summary_no_segments": "entry 0",
    "summary_all_due": "entry 0",
    "summary_segment1_min": "refused",
    "summary_segment1_max": "entry 0",
    "summary_last_min": "entry 0",
    "summary_last_max": "entry 0",
    "summary_counts_moved": "entry 0",
    "summary_prefix_shorter": "segment 1",
    "summary_prefix_next": "segment 1",
    "summary_prefix_time": "segment 1",
    "summary_prefix_ledger": "refused",
    "summary_prefix_entry": "segment 1",
}
