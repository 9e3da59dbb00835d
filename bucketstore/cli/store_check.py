"""Offline inspection of a whole store: its catalog against its ledger files.

Used by ``bucketstore catalog``, ``stats``, ``dump STORE`` and ``verify STORE``.
The catalog is opened read-only and the store's write lock is not taken, so
these commands work beside a running writer (they then see the catalog as of
its last commit).
"""

from __future__ import annotations

import fcntl
import os
import re
from typing import Any

from ..engine.catalog import Catalog
from ..engine.identity import identity_problems
from ..errors import CatalogError, CorruptLedgerError
from ..format.ledger_file import ledger_file_name
from ..format.snapshot import BucketFile, parse_bucket_key
from .verify import Finding, check_file

__all__ = ["is_store", "describe_store", "verify_store"]

_LEDGER_NAME = re.compile(r"^(\d{20})\.ledger$")


def is_store(path: str | os.PathLike[str]) -> bool:
    """True if ``path`` looks like a store directory: it has ``catalog/data.mdb``, or a
    ``catalog/`` or ``ledgers/`` directory (a store whose catalog is lost is still a store,
    and a damaged one)."""
    return os.path.isfile(os.path.join(path, "catalog", "data.mdb")) \
        or os.path.isdir(os.path.join(path, "catalog")) or os.path.isdir(os.path.join(path, "ledgers"))


def _lock_holder(path: str) -> str | None:
    """The pid recorded by the process holding the store's write lock, or None if unlocked."""
    try:
        fd = os.open(os.path.join(path, "LOCK"), os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def describe_store(path: str | os.PathLike[str], *, read_files: bool = True) -> dict[str, Any]:
    """Everything the catalog says, with each bucket's file facts (size, counts) when readable."""
    path = os.fspath(path)
    ledgers_dir = os.path.join(path, "ledgers")
    doc: dict[str, Any] = {"store": os.path.abspath(path), "writer_pid": _lock_holder(path), "trackers": {}}
    with Catalog(os.path.join(path, "catalog"), readonly=True) as catalog:
        doc["next_ledger_id"] = catalog.next_ledger_id()
        doc["store_id"] = catalog.store_id
        referenced = set()
        for name in catalog.tracker_names():
            state = catalog.tracker_state(name) or {}
            buckets = []
            for key, ledger_id in sorted(catalog.buckets(name).items(), key=lambda kv: _range_or_max(kv[0])):
                referenced.add(ledger_id)
                file = os.path.join(ledgers_dir, ledger_file_name(ledger_id))
                entry: dict[str, Any] = {"key": key, "ledger_id": ledger_id, "file": file}
                try:
                    entry["start_ledger"], entry["end_ledger"] = parse_bucket_key(key)
                except ValueError:
                    entry["error"] = "not a bucket key"
                if read_files:
                    _add_file_facts(file, entry)
                buckets.append(entry)
            doc["trackers"][name] = {
                "mark_delete": state.get("mark_delete"),
                "buckets": buckets,
                "indexes": sum(b.get("indexes", 0) for b in buckets),
                "bytes": sum(b.get("size", 0) for b in buckets),
            }
    files = sorted(os.listdir(ledgers_dir)) if os.path.isdir(ledgers_dir) else []
    doc["ledger_files"] = sum(1 for f in files if _LEDGER_NAME.match(f))
    doc["orphan_files"] = [f for f in files if (m := _LEDGER_NAME.match(f)) and int(m.group(1)) not in referenced]
    doc["temporary_files"] = [f for f in files if f.endswith(".ledger.tmp")]
    doc["indexes"] = sum(t["indexes"] for t in doc["trackers"].values())
    doc["bytes"] = sum(t["bytes"] for t in doc["trackers"].values())
    return doc


def _range_or_max(key: str) -> tuple[int, int]:
    try:
        return parse_bucket_key(key)
    except ValueError:
        return (1 << 64, 1 << 64)


def _add_file_facts(file: str, entry: dict[str, Any]) -> None:
    try:
        with BucketFile(file) as bf:
            meta = bf.metadata
            entry.update(size=bf.size, indexes=meta.count, segments=bf.segment_count,
                         min_timestamp=meta.segments[0].min_timestamp if meta.segments else None,
                         max_timestamp=meta.segments[-1].max_timestamp if meta.segments else None)
    except FileNotFoundError:
        entry["error"] = "ledger file is missing"
    except CorruptLedgerError as exc:
        entry["error"] = str(exc)


def verify_store(path: str | os.PathLike[str]) -> tuple[list[Finding], dict[str, int]]:
    """Check a store: every referenced file completely, and the catalog against the files.

    Findings: a key whose file is missing or damaged, a file holding another
    range than its key, overlapping ranges within a tracker, orphan and
    temporary files (harmless: the next open removes them, but reported).
    """
    path = os.fspath(path)
    findings: list[Finding] = []
    counts = {"files": 0, "segments": 0, "indexes": 0}
    try:
        doc = describe_store(path, read_files=False)
    except CatalogError as exc:
        return [Finding(os.path.join(path, "catalog"), None, str(exc))], counts
    for name, tracker in doc["trackers"].items():
        previous = None
        for b in tracker["buckets"]:
            where = f"tracker {name!r} key {b['key']}"
            if "error" in b:
                findings.append(Finding(path, None, f"{where}: {b['error']}"))
                continue
            if previous is not None and b["start_ledger"] <= previous["end_ledger"]:
                findings.append(Finding(path, None, f"{where} overlaps {previous['key']}"))
            previous = b
            if not os.path.exists(b["file"]):
                findings.append(Finding(b["file"], None, f"{where}: ledger file is missing"))
                continue
            report = check_file(b["file"])
            counts["files"] += 1
            counts["segments"] += report.segments
            counts["indexes"] += report.indexes
            findings.extend(report.findings)
            if not report.findings:
                try:
                    with BucketFile(b["file"]) as bf:
                        # The file must be the one the entry names: ledger id, tracker, store, range.
                        problems = identity_problems(bf, ledger_id=b["ledger_id"], tracker=name,
                                                     store_id=doc.get("store_id"), key=b["key"])
                except CorruptLedgerError as exc:
                    findings.append(Finding(exc.path, exc.offset, exc.reason))
                    continue
                if problems:
                    findings.append(Finding(b["file"], None, f"{where} (ledger {b['ledger_id']}) disagrees with "
                                                             f"the file: {'; '.join(problems)}"))
    ledgers_dir = os.path.join(path, "ledgers")
    for f in doc["orphan_files"]:
        findings.append(Finding(os.path.join(ledgers_dir, f), None,
                                "orphan ledger file: no catalog key references it (removed on next open)"))
    for f in doc["temporary_files"]:
        findings.append(Finding(os.path.join(ledgers_dir, f), None,
                                "temporary file of an unfinished seal (removed on next open)"))
    return findings, counts
