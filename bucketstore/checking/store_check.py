"""Offline inspection of a whole store: its catalog against its ledger and journal files.

Used by ``bucketstore catalog``, ``stats``, ``dump STORE`` and ``verify STORE``.
None of them takes the store's write lock, so they run beside a live writer.
What makes their view consistent there:

* the catalog is read in one LMDB read transaction, registered in LMDB's
  reader table (:func:`~bucketstore.engine.catalog.catalog.read_catalog_snapshot`):
  the view is one commit of the writer, never half a seal or a merge;
* a referenced ledger file that is gone when read was retired by a commit
  after the snapshot (the writer removes the key before unlinking the file):
  a fresh snapshot is taken and the view is rebuilt from it ("retry what
  moved"). A file is *missing* — damage — only when a snapshot taken after
  the failed read still references it. Ledger files are immutable and their
  ids never reused, so the files already checked are not read again;
* files the catalog does not reference are judged against a snapshot taken
  after the directory listing: referenced there, or gone, means in flight (a
  seal registering, a merge retiring). Beside a live writer, an unreferenced
  ledger file or a ``*.tmp`` file is in flight too (the writer creates and
  retires them); without one it is left over by a crash: an orphan, reported
  and removed by the next open;
* journal files: a torn tail is what ``open`` cuts off — a warning, or in
  flight beside a live writer (its group may be half-written as we read);
  damage elsewhere is damage; files a checkpoint removed while being read
  are listed again.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any

from ..format.bucket_summary import decode_summary, prefix_mismatch, summary_mismatch
from ..engine.catalog.catalog import CatalogSnapshot, read_catalog_snapshot
from ..engine.directory.identity import identity_problems
from ..engine.directory.store_lock import writer_pid
from ..engine.topics.topic_file import topics_directory
from ..engine.topics.topic_reader import describe_topics, verify_topics
from ..engine.durability.journal import journal_directory
from ..engine.store.tracker_record import recorded_durability
from ..errors import CatalogError, CorruptLedgerError, JournalError
from ..format.journal_codec import parse_file
from ..format.ledger_file import LedgerReader, ledger_file_name
from ..format.snapshot import BucketFile, parse_bucket_key
from .ledger_check import FileReport, Finding, check_file

__all__ = ["is_store", "NOT_A_STORE", "describe_store", "verify_store"]

_LEDGER_NAME = re.compile(r"^(\d{20})\.ledger$")
_JOURNAL_NAME = re.compile(r"^(\d{20})\.journal$")
#: Fresh snapshots to take while referenced files keep being retired under us.
_ATTEMPTS = 20

#: Examines one referenced ledger file into its catalog entry; returns False when the file is gone.
Examine = Callable[[str, dict[str, Any]], bool]


def is_store(path: str | os.PathLike[str]) -> bool:
    """True if ``path`` is a store directory: it has a ``catalog/`` or a ``ledgers/``
    directory (``catalog/data.mdb`` normally; a store whose catalog is lost is still a
    store, and a damaged one). The one definition every command uses."""
    return os.path.isdir(os.path.join(path, "catalog")) or os.path.isdir(os.path.join(path, "ledgers"))


#: What the commands say of a directory :func:`is_store` rejects.
NOT_A_STORE = "not a bucketstore store (no catalog/ or ledgers/ directory)"


def describe_store(path: str | os.PathLike[str], *, read_files: bool = True) -> dict[str, Any]:
    """Everything the catalog says, with each bucket's file facts (size, counts) when readable.

    One catalog snapshot, consistent with the files read (see the module
    docstring). ``doc["in_flight_files"]`` lists files the live writer is
    creating or retiring; ``orphan_files`` and ``temporary_files`` only what
    a crash left behind.
    """
    cache: dict[int, dict[str, Any]] = {}

    def facts(file: str, entry: dict[str, Any]) -> bool:
        lid = entry["ledger_id"]
        if lid not in cache:
            found: dict[str, Any] = {}
            if not _add_file_facts(file, found):
                return False
            cache[lid] = found
        entry.update(cache[lid])
        return True

    doc = _consistent_view(os.fspath(path), facts if read_files else None)
    for tracker in doc["trackers"].values():
        for entry in tracker["buckets"]:
            entry["summary"] = entry["summary"] is not None  # JSON-friendly: whether the catalog has one
    try:
        doc["topics"] = describe_topics(os.fspath(path))
    except CatalogError as exc:  # damage of the topic index: said, not raised (verify reports it)
        doc["topics"] = {"error": str(exc)}
    return doc


def _consistent_view(path: str, examine: Examine | None) -> dict[str, Any]:
    catalog_dir = os.path.join(path, "catalog")
    writer = writer_pid(path)
    snapshot = read_catalog_snapshot(catalog_dir)
    for attempt in range(_ATTEMPTS):
        doc, gone = _view_of(path, snapshot, examine)
        if not gone:
            break
        fresh = read_catalog_snapshot(catalog_dir)
        retired = [entry for tracker, entry in gone if fresh.buckets(tracker).get(entry["key"]) != entry["ledger_id"]]
        if not retired:
            break  # still referenced after it was found gone: really missing
        if attempt == _ATTEMPTS - 1:
            for entry in retired:  # the writer keeps retiring faster than we read: say so, not "damage"
                del entry["error"]
                entry["in_flight"] = "retired by the writer while being read"
            break
        snapshot = fresh
    # Live at the start or now: either way its files may be moving under the listing.
    doc["writer_pid"] = writer or writer_pid(path)
    _classify_files(path, doc, snapshot, doc["writer_pid"] is not None)
    doc["indexes"] = sum(t["indexes"] for t in doc["trackers"].values())
    doc["bytes"] = sum(t["bytes"] for t in doc["trackers"].values())
    doc["journal_files"], doc["journal_bytes"] = _journal_usage(path)
    return doc


def _journal_usage(path: str) -> tuple[int | None, int]:
    """The ``*.journal`` files under ``journal/`` and their bytes (None files: no journal, sealed mode).

    Counted as ``verify`` reads them (leftover ``*.journal.tmp`` files are not journal files);
    a file a live writer's checkpoint removes meanwhile is simply not counted.
    """
    root = os.path.join(path, "journal")
    if not os.path.isdir(root):
        return None, 0
    files = size = 0
    for directory in sorted(os.listdir(root)):
        try:
            with os.scandir(os.path.join(root, directory)) as entries:
                for entry in entries:
                    if _JOURNAL_NAME.match(entry.name):
                        try:
                            size += entry.stat(follow_symlinks=False).st_size
                        except FileNotFoundError:
                            continue
                        files += 1
        except (FileNotFoundError, NotADirectoryError):
            continue
    return files, size


def _view_of(path: str, snapshot: CatalogSnapshot,
             examine: Examine | None) -> tuple[dict[str, Any], list[tuple[str, dict[str, Any]]]]:
    """The document of one snapshot, and the referenced files found gone while reading it."""
    ledgers_dir = os.path.join(path, "ledgers")
    doc: dict[str, Any] = {"store": os.path.abspath(path), "writer_pid": None, "trackers": {},
                           "next_ledger_id": snapshot.next_ledger_id(), "store_id": snapshot.store_id}
    gone: list[tuple[str, dict[str, Any]]] = []
    for name in snapshot.tracker_names():
        state = snapshot.tracker_state(name) or {}
        buckets = []
        for key, ledger_id in sorted(snapshot.buckets(name).items(), key=lambda kv: _range_or_max(kv[0])):
            file = os.path.join(ledgers_dir, ledger_file_name(ledger_id))
            entry: dict[str, Any] = {"key": key, "ledger_id": ledger_id, "file": file,
                                     "summary": snapshot.summaries.get(name, {}).get(key)}
            try:
                entry["start_ledger"], entry["end_ledger"] = parse_bucket_key(key)
            except ValueError:
                entry["error"] = "not a bucket key"
            if examine is not None and not examine(file, entry):
                entry["error"] = "ledger file is missing"
                gone.append((name, entry))
            buckets.append(entry)
        doc["trackers"][name] = {
            # What a writable open must use (a sealed store refuses a journal tracker holding anything).
            "durability": recorded_durability(snapshot.tracker_state(name), path, name),
            "mark_delete": state.get("mark_delete"),
            "buckets": buckets,
            "indexes": sum(b.get("indexes", 0) for b in buckets),
            "bytes": sum(b.get("size", 0) for b in buckets),
        }
    return doc, gone


def _classify_files(path: str, doc: dict[str, Any], snapshot: CatalogSnapshot, writer_live: bool) -> None:
    """Sort the files of ``ledgers/`` into referenced, in flight, orphan and temporary."""
    ledgers_dir = os.path.join(path, "ledgers")
    files = sorted(os.listdir(ledgers_dir)) if os.path.isdir(ledgers_dir) else []
    referenced = snapshot.referenced_ledgers()
    unreferenced = [f for f in files if (m := _LEDGER_NAME.match(f)) and int(m.group(1)) not in referenced]
    temporary = [f for f in files if f.endswith(".ledger.tmp")]
    in_flight: list[str] = []
    if unreferenced:
        # Judged against a snapshot taken after the listing: a seal that registered
        # its file meanwhile, or a retired file already unlinked, is no orphan.
        later = read_catalog_snapshot(os.path.join(path, "catalog")).referenced_ledgers()
        still = []
        for f in unreferenced:
            moved = int(f[:20]) in later or not os.path.exists(os.path.join(ledgers_dir, f))
            (in_flight if moved or writer_live else still).append(f)
        unreferenced = still
    if writer_live:
        in_flight += temporary
        temporary = []
    # A file the writer retired since the listing is no longer one (as for Store.stats()).
    doc["ledger_files"] = sum(1 for f in files if _LEDGER_NAME.match(f) and os.path.exists(os.path.join(ledgers_dir, f)))
    doc["orphan_files"] = unreferenced
    doc["temporary_files"] = temporary
    doc["in_flight_files"] = sorted(in_flight)


def _range_or_max(key: str) -> tuple[int, int]:
    try:
        return parse_bucket_key(key)
    except ValueError:
        return (1 << 64, 1 << 64)


def _add_file_facts(file: str, entry: dict[str, Any]) -> bool:
    """Fill ``entry`` with a bucket file's facts or its damage; False when the file does not exist."""
    try:
        with BucketFile(file) as bf:
            meta = bf.metadata
            entry.update(size=bf.size, indexes=meta.count, segments=bf.segment_count,
                         min_timestamp=meta.segments[0].min_timestamp if meta.segments else None,
                         max_timestamp=meta.segments[-1].max_timestamp if meta.segments else None)
    except FileNotFoundError:
        return False
    except CorruptLedgerError as exc:
        entry["error"] = str(exc)
    except OSError as exc:
        entry["error"] = f"cannot read {file}: {exc.strerror or exc}"
    return True


def _check_summary(path: str, where: str, entry: dict[str, Any], bf: BucketFile) -> list[Finding]:
    """The catalog's summary of a bucket against its file's entry 0 (read when the tracker opens
    instead of the file, so a disagreement is damage); a missing one is a warning: the next
    writable open summarises the file (a catalog written before summaries existed)."""
    catalog = os.path.join(path, "catalog")
    raw = entry.get("summary")
    if raw is None:
        return [Finding(catalog, None, f"{where}: no bucket summary in the catalog (written by an older "
                                       "release; the next open reads entry 0 and adds it)", warning=True)]
    try:
        summary = decode_summary(raw, path=catalog, key=entry["key"])
    except CatalogError as exc:
        return [Finding(catalog, None, str(exc))]
    if summary.ledger_id != entry["ledger_id"]:
        return [Finding(catalog, None, f"{where}: the key names ledger {entry['ledger_id']}, its summary "
                                       f"describes ledger {summary.ledger_id}")]
    why = summary_mismatch(summary, bf.metadata, bf.size)
    if why is not None:
        return [Finding(bf.path, bf.ledger.entry_payload_offset(0), f"{where}: {why}")]
    if summary.prefix_rows:
        # The first batch after a restart delivers these rows without reading the file.
        try:
            with BucketFile(bf.path) as again:  # (``bf`` is closed by now)
                seg = again.read_segment(1)
        except FileNotFoundError:
            return []  # retired by a live writer since it was checked
        except CorruptLedgerError as exc:
            return [Finding(exc.path, exc.offset, exc.reason)]
        why = prefix_mismatch(summary, seg.timestamps, seg.ledger_ids, seg.entry_ids)
        if why is not None:
            return [Finding(bf.path, bf.ledger.entry_payload_offset(1), f"{where}: {why}")]
    return []


def verify_store(path: str | os.PathLike[str],
                 on_file: Callable[[], None] | None = None) -> tuple[list[Finding], dict[str, int]]:
    """Check a store: the catalog, every referenced ledger file completely, every journal file.

    Findings (damage): a key whose file is missing or damaged, a file holding
    another range than its key, overlapping ranges within a tracker, a
    damaged journal, and — when no writer is live — orphan and temporary
    files a crash left (the next open removes them, but a catalog that lost
    its keys would look just like that). Warnings (``Finding.warning``, exit
    0): a journal's torn tail or leftover checkpoint file, which the next
    ``open`` cuts off. Files in flight beside a live writer are counted, not
    reported. ``on_file`` is called after each ledger file is read (progress).
    """
    path = os.fspath(path)
    findings: list[Finding] = []
    counts = {"files": 0, "segments": 0, "indexes": 0, "in_flight": 0}
    reports: dict[int, FileReport] = {}

    def check(file: str, entry: dict[str, Any]) -> bool:
        lid = entry["ledger_id"]
        if lid not in reports:
            report = check_file(file)
            if on_file is not None:
                on_file()
            if report.missing:
                return False
            reports[lid] = report
        entry["report"] = reports[lid]
        return True

    try:
        doc = _consistent_view(path, check)
    except CatalogError as exc:
        return [Finding(exc.path or os.path.join(path, "catalog"), None, str(exc))], counts
    for name, tracker in doc["trackers"].items():
        previous = None
        for b in tracker["buckets"]:
            where = f"tracker {name!r} key {b['key']}"
            if "in_flight" in b:
                counts["in_flight"] += 1
                continue
            if "error" in b:
                missing = b["error"] == "ledger file is missing"
                findings.append(Finding(b["file"] if missing else path, None, f"{where}: {b['error']}"))
                continue
            if previous is not None and b["start_ledger"] <= previous["end_ledger"]:
                findings.append(Finding(path, None, f"{where} overlaps {previous['key']}"))
            previous = b
            report = b["report"]
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
                except FileNotFoundError:
                    counts["in_flight"] += 1  # retired by a live writer since it was checked
                    continue
                except CorruptLedgerError as exc:
                    findings.append(Finding(exc.path, exc.offset, exc.reason))
                    continue
                if problems:
                    findings.append(Finding(b["file"], None, f"{where} (ledger {b['ledger_id']}) disagrees with "
                                                             f"the file: {'; '.join(problems)}"))
                    continue
                findings.extend(_check_summary(path, where, b, bf))
    ledgers_dir = os.path.join(path, "ledgers")
    for f in doc["orphan_files"]:
        file = os.path.join(ledgers_dir, f)
        kept = _why_open_keeps(file, int(f[:20]), doc.get("store_id"))
        if kept is None:  # what a crash leaves between a file and its catalog commit: open tidies it
            findings.append(Finding(file, None, "orphan ledger file: no catalog key references it "
                                                "(removed on next open)", warning=True))
        else:
            findings.append(Finding(file, None, f"orphan ledger file: no catalog key references it, "
                                                f"and open keeps it: {kept}"))
    for f in doc["temporary_files"]:
        findings.append(Finding(os.path.join(ledgers_dir, f), None,
                                "temporary file of an unfinished seal (removed on next open)", warning=True))
    counts["in_flight"] += len(doc["in_flight_files"])
    writer_live = doc["writer_pid"] is not None
    owners = {os.path.basename(journal_directory(path, name)): name for name in doc["trackers"]}
    findings += _verify_journals(path, writer_live, counts, doc.get("store_id"), owners)
    findings += [Finding(topics_directory(path), None, problem) for problem in verify_topics(path)]
    return findings, counts


def _why_open_keeps(path: str, ledger_id: int, store_id: str | None) -> str | None:
    """Why the next open would not delete this unreferenced ledger file, or None if it would.

    The same evidence open asks for before it deletes (``Store._provably_garbage``): a
    readable header naming this ledger id and this store. A crash cannot leave anything else
    (files are renamed into place only after an fsync), so anything else is damage.
    """
    try:
        with LedgerReader(path) as reader:
            header_id, owner = reader.ledger_id, reader.properties.get("store_id")
    except FileNotFoundError:
        return None  # removed meanwhile
    except (CorruptLedgerError, OSError) as exc:
        return f"it cannot be read ({exc})"
    if owner is not None and owner != store_id:  # (a catalog naming no store: a new one, refused too)
        return f"it belongs to store {owner}, not to this catalog's store {store_id} (open refuses the store)"
    if header_id != ledger_id:
        return f"its header says ledger {header_id}"
    return None


def _verify_journals(path: str, writer_live: bool, counts: dict[str, int], store_id: str | None,
                     owners: dict[str, str]) -> list[Finding]:
    """Parse every journal file as ``open``'s replay would, without repairing anything.

    ``owners`` maps a journal directory's name to the tracker the catalog
    knows by it; with the store id, that is the identity its headers must
    carry (a directory of no known tracker is checked for framing only).
    """
    root = os.path.join(path, "journal")
    try:
        directories = sorted(os.listdir(root))
    except FileNotFoundError:
        return []  # sealed mode: no journal
    findings: list[Finding] = []
    for name in directories:
        directory = os.path.join(root, name)
        if os.path.isdir(directory):
            owner = owners.get(name)
            identity = (store_id, owner) if store_id is not None and owner is not None else None
            findings += _verify_journal_directory(directory, writer_live, counts, identity)
    return findings


def _verify_journal_directory(directory: str, writer_live: bool, counts: dict[str, int],
                              identity: tuple[str, str] | None) -> list[Finding]:
    for _ in range(_ATTEMPTS):
        findings: list[Finding] = []
        read = in_flight = 0
        try:
            names = sorted(os.listdir(directory))
        except FileNotFoundError:
            return []  # the tracker was deleted while we looked
        files = [(int(m.group(1)), os.path.join(directory, n)) for n in names if (m := _JOURNAL_NAME.match(n))]
        leftovers = [os.path.join(directory, n) for n in names if n.endswith(".journal.tmp")]
        try:
            for i, (number, file) in enumerate(files):
                with open(file, "rb") as f:
                    data = f.read()
                read += 1
                try:
                    parsed = parse_file(data, file, number, last=(i == len(files) - 1), identity=identity)
                except JournalError as exc:
                    findings.append(Finding(exc.path, exc.offset, exc.reason))
                    continue
                if parsed.torn_at is None:
                    continue
                if writer_live:
                    in_flight += 1  # the writer's next group may be half-written as we read it
                else:
                    findings.append(Finding(file, parsed.torn_at, f"torn tail of {len(data) - parsed.torn_at} "
                                                                  "byte(s) from a crash (cut off on next open)",
                                            warning=True))
        except FileNotFoundError:
            continue  # a checkpoint removed older files between the listing and the read: list again
        counts["files"] += read
        counts["in_flight"] += in_flight
        for file in leftovers:
            if writer_live:
                counts["in_flight"] += 1
            else:
                findings.append(Finding(file, None, "temporary file of an interrupted checkpoint "
                                                    "(removed on next open)", warning=True))
        return findings
    return [Finding(directory, None, f"journal files kept vanishing while being read ({_ATTEMPTS} attempts)")]
