"""What a store must hold after a crash in ``sealed`` mode, computed from its committed catalog.

Shared by the crash-point enumeration and the crash state machine. The oracle
is stated in terms of the catalog state ``S`` that LMDB had committed when the
process died (read from the still-open environment before it is abandoned):

* **may** (no phantom): a recovered position lies in a bucket that ``S`` lists
  (after the enclosing range of an unfinished merge wins) and is not at or
  before ``S``'s mark-delete position;
* **must** (no loss): every index of those buckets whose time is after the
  reopen cutoff is tracked again. Due indexes may be skipped (Pulsar §3.9: the
  embedder replays them), delivered ones may come back (at-least-once), and
  what only the mutable bucket or the queue held was never durable.

It also checks the store's files against its catalog after recovery: every key
names a file that verifies, and nothing else is left in ``ledgers/``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bucketstore.ledger_file import ledger_file_name
from bucketstore.snapshot import BucketFile, parse_bucket_key
from bucketstore.verify import verify_file

Triple = tuple[int, int, int]  # (deliver_at, ledger, entry)
Position = tuple[int, int]


@dataclass(frozen=True)
class CatalogState:
    """One tracker's committed catalog: bucket key -> ledger id, and the mark-delete position."""

    keys: tuple[tuple[str, int], ...]
    mark_delete: Position | None

    @classmethod
    def read(cls, catalog: Any, tracker: str) -> "CatalogState":
        state = catalog.tracker_state(tracker) or {}
        md = state.get("mark_delete")
        return cls(tuple(sorted(catalog.buckets(tracker).items())), tuple(md) if md else None)

    def diff_kind(self, before: "CatalogState") -> str:
        """Name the atomic operation that turned ``before`` into this state."""
        old, new = dict(before.keys), dict(self.keys)
        added, removed = new.keys() - old.keys(), old.keys() - new.keys()
        if added and removed:
            return "merge"
        if added:
            return "seal"
        if removed:
            return "delete"
        if self.mark_delete != before.mark_delete:
            return "mark-delete"
        return "tracker-state"


@dataclass
class Expectation:
    """The bounds a recovered tracker must meet."""

    must: set[Position] = field(default_factory=set)
    may: set[Position] = field(default_factory=set)
    triples: set[Triple] = field(default_factory=set)  # every index in S's live buckets


def read_bucket(path: Path) -> list[Triple]:
    """Every index of a sealed bucket file, segment by segment."""
    out: list[Triple] = []
    with BucketFile(path) as bf:
        for k in range(1, bf.segment_count + 1):
            seg = bf.read_segment(k)
            out.extend(zip(seg.timestamps.tolist(), seg.ledger_ids.tolist(), seg.entry_ids.tolist()))
    return out


def live_keys(state: CatalogState) -> list[tuple[str, int]]:
    """The keys recovery keeps: a range enclosed by another is a merge leftover."""
    ranges = [(parse_bucket_key(k), k, lid) for k, lid in state.keys]
    return [(k, lid) for (s, e), k, lid in ranges
            if not any((s2, e2) != (s, e) and s2 <= s and e <= e2 for (s2, e2), _, _ in ranges)]


def expect(state: CatalogState, ledgers_dir: Path, cutoff: int) -> Expectation:
    """Bounds for a tracker recovered from ``state`` with the given reopen cutoff.

    Reads the bucket files the state names; call it before crash damage is
    applied (a committed key must name a file that survives any damage, which
    is what the recovery then checks).
    """
    out = Expectation()
    md = state.mark_delete
    for _key, lid in live_keys(state):
        for ts, ledger, entry in read_bucket(ledgers_dir / ledger_file_name(lid)):
            out.triples.add((ts, ledger, entry))
            if md is not None and (ledger, entry) <= md:
                continue
            out.may.add((ledger, entry))
            if ts > cutoff:
                out.must.add((ledger, entry))
    return out


def check_recovered(tracker: Any, exp: Expectation, universe: set[Position], context: str) -> set[Position]:
    """Assert the recovered tracker meets ``exp``; return the positions it tracks.

    ``universe`` is every position the workload ever added: the count must equal
    the tracked positions found among it, so nothing outside it is tracked.
    """
    tracker._check()
    got = {p for p in universe if tracker.contains_message(*p)}
    assert tracker.number_of_delayed_messages == len(got), \
        f"{context}: count {tracker.number_of_delayed_messages} but {len(got)} positions tracked"
    lost = exp.must - got
    assert not lost, f"{context}: lost {len(lost)} durable, undue indexes, e.g. {sorted(lost)[:5]}"
    phantom = got - exp.may
    assert not phantom, f"{context}: {len(phantom)} phantom indexes, e.g. {sorted(phantom)[:5]}"
    return got


def check_files(store: Any, tracker_name: str, context: str) -> None:
    """After recovery: every key's file exists and verifies; no orphan or temporary file is left."""
    ledgers = Path(store.ledgers_dir)
    referenced = set()
    for key, lid in store.catalog.buckets(tracker_name).items():
        path = ledgers / ledger_file_name(lid)
        assert path.is_file(), f"{context}: key {key} names missing {path.name}"
        findings = verify_file(path)
        assert not findings, f"{context}: {path.name} does not verify: {[str(f) for f in findings]}"
        referenced.add(path.name)
    on_disk = set(os.listdir(ledgers))
    assert on_disk == referenced, \
        f"{context}: ledgers/ holds {sorted(on_disk - referenced)} beyond the catalog's files"
