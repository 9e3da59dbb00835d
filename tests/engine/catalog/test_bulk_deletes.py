"""Bulk deletions never make a store unopenable (issue 24, item 1).

A write transaction that removes hundreds of catalog keys allocates pages, frees
them again before commit and never writes them, so LMDB's meta page counts
pages past the end of a healthy ``data.mdb``. Each case here does such a
deletion on a real store with two trackers of many buckets, then closes it
cleanly or SIGKILLs the real process that did it, and reopens: the open must
succeed and every tracker must hold exactly what it held before.

``BUCKETSTORE_BULK_LEDGERS`` (default 150 buckets per tracker; below about 150 LMDB may
write every page it allocated, and the cases stop reproducing the bug: a test says so).
"""

from __future__ import annotations

import os
import shutil
import signal
import struct
import time

import pytest
from helpers import FakeClock

import bucketstore
from bucketstore import TrackerConfig
from bucketstore.cli.commands import main

#: One bucket per ledger of 10 indexes: many catalog keys and summaries from few adds.
CONFIG = TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=10, max_indexes_per_segment=4)
MERGING = TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=10, max_indexes_per_segment=4,
                        max_num_buckets=40)
LEDGERS = int(os.environ.get("BUCKETSTORE_BULK_LEDGERS", "150"))
FAR = 10**12


def _rows(base: int) -> list[tuple[int, int, int]]:
    return [(ledger, entry, 10**6 + base + 10 * ledger + entry) for ledger in range(LEDGERS) for entry in range(10)]


def _build(path, config) -> dict[str, set[tuple[int, int]]]:
    """Two trackers of LEDGERS buckets each (journal durability: every add survives)."""
    with bucketstore.open(path, "journal") as store:
        for name, base in (("a", 0), ("b", 5)):
            t = store.tracker(name, config, FakeClock(0))
            for ledger in range(LEDGERS):
                t.add_messages([row for row in _rows(base) if row[0] == ledger])
            t.wait_for_maintenance()
    return {name: {(l, e) for l, e, _ in _rows(0)} for name in ("a", "b")}


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """One built store, copied by each test (a closed store's directory is a whole store)."""
    path = tmp_path_factory.mktemp("bulk") / "template"
    return path, _build(path, CONFIG)


def _copy(template, path) -> dict[str, set[tuple[int, int]]]:
    source, expected = template
    shutil.copytree(source, path)
    return {name: set(rows) for name, rows in expected.items()}


def _clear(store):
    store.tracker("a", CONFIG, FakeClock(0)).clear()


def _mark_delete(store):
    store.tracker("a", CONFIG, FakeClock(0)).mark_delete(LEDGERS, 0)  # past every bucket of a


def _delete_tracker(store):
    store.delete_tracker("a")


def _merge(store):
    # A bucket cap merges the buckets down, deleting the keys and summaries of the merged ones.
    for name in ("a", "b"):
        t = store.tracker(name, MERGING, FakeClock(0))
        t.add_message(LEDGERS + 1, 0, FAR)  # a write: merging is scheduled by the tracker's work
        t.wait_for_maintenance()
        assert len(store.catalog.buckets(name)) <= MERGING.max_num_buckets + 1


def _deliver(store):
    # Everything of a is due: taking it exhausts, and so deletes, every bucket of a.
    clock = FakeClock(0)
    t = store.tracker("a", CONFIG, clock)
    clock.now = FAR
    assert len(t.get_scheduled_messages(10**6)) == 10 * LEDGERS
    t.mark_delete(LEDGERS, 0)


def _a_emptied(expected):
    return {**expected, "a": set()}


#: op -> (what it does to a store, what it does to the expected contents)
OPS = {
    "clear": (_clear, _a_emptied),
    "mark_delete": (_mark_delete, _a_emptied),
    "delete_tracker": (_delete_tracker, lambda expected: {"b": expected["b"]}),
    "merge": (_merge, lambda expected: {name: rows | {(LEDGERS + 1, 0)} for name, rows in expected.items()}),
    "deliver": (_deliver, _a_emptied),
}


def _contents(path, config=CONFIG) -> dict[str, set[tuple[int, int]]]:
    with bucketstore.open(path, "journal") as store:
        out = {}
        for name in store.trackers():
            clock = FakeClock(0)
            t = store.tracker(name, config, clock)
            clock.now = FAR
            out[name] = set(t.get_scheduled_messages(10**7))
        return out


def _ends_before_last_page(path) -> bool:
    """Whether data.mdb is shorter than its newer meta page's last page number says."""
    raw = (path / "catalog" / "data.mdb").read_bytes()
    page_size = struct.unpack_from("<I", raw, 40)[0]
    metas = [struct.unpack_from("<QQ", raw, at + 136) for at in (0, page_size)]
    last_page, _ = max(metas, key=lambda m: m[1])
    return len(raw) < (last_page + 1) * page_size


def _run_and_kill(path, act, durability="journal") -> None:
    """Run ``act(store)`` in a forked child process, then SIGKILL it once that has committed."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never returns into pytest
        try:
            os.close(r)
            store = bucketstore.open(path, durability)
            act(store)
            os.write(w, b"r")
            time.sleep(30)
        finally:
            os._exit(1)
    os.close(w)
    try:
        assert os.read(r, 1) == b"r", "the child failed before its deletion committed"
    finally:
        os.close(r)
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("ending", ["close", "sigkill"])
def test_a_bulk_deletion_leaves_an_openable_store_with_exact_contents(tmp_path, template, op, ending):
    path = tmp_path / "s"
    act, expect = OPS[op]
    expected = expect(_copy(template, path))
    if ending == "close":
        with bucketstore.open(path, "journal") as store:
            act(store)
    else:
        _run_and_kill(path, act)
    if op in ("clear", "mark_delete", "deliver"):
        # What makes these cases test the bug: LMDB left the file shorter than its meta page says.
        assert _ends_before_last_page(path)
    # Opens, read-only tools included, accept the file; the contents are exactly what was left.
    for command in ("verify", "catalog", "stats"):
        assert main([command, str(path)]) == 0, command
    # A checkpoint copies the short file's catalog (one read transaction) into a store that opens.
    assert main(["checkpoint", str(path), str(tmp_path / "copy")]) == 0
    config = MERGING if op == "merge" else CONFIG
    assert _contents(tmp_path / "copy", config) == expected
    assert _contents(path, config) == expected


def _recover_all(store):
    return {name: store.tracker(name, CONFIG, FakeClock(FAR)).number_of_delayed_messages
            for name in store.trackers()}


@pytest.mark.parametrize("ending", ["close", "sigkill"])
def test_recovery_dropping_buckets_then_reopen(tmp_path, ending):
    """A sealed-mode open long after everything was due recovers (and may drop buckets), then
    closes or is killed: the next open must still succeed, and see what that one left."""
    path = tmp_path / "s"
    with bucketstore.open(path, "sealed") as store:
        for name in ("a", "b"):
            t = store.tracker(name, CONFIG, FakeClock(0))
            for ledger in range(LEDGERS + 1):  # the last ledger only rolls the one before it
                t.add_messages([row for row in _rows(0) if row[0] == ledger] or [(ledger, 0, 10**6)])
            t.wait_for_maintenance()
    if ending == "close":
        with bucketstore.open(path, "sealed") as store:
            first = _recover_all(store)
    else:
        _run_and_kill(path, _recover_all, durability="sealed")
        with bucketstore.open(path, "sealed") as store:
            first = _recover_all(store)
    with bucketstore.open(path, "sealed") as store:
        assert _recover_all(store) == first
    assert main(["verify", str(path)]) == 0
