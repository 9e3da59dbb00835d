"""``engine.catalog.lmdb_file.check_data_file`` on real LMDB files: every file LMDB writes is accepted,
a page the trees reference past the end is a CatalogError (never SIGBUS), hostile bytes end in
a CatalogError or an accepted file, quickly.

``BUCKETSTORE_LMDB_FUZZ`` sets the number of random corruptions tried (default 300).
"""

from __future__ import annotations

import os
import random
import signal
import struct
import subprocess
import sys
import textwrap
import threading
import time

import lmdb
import pytest

from bucketstore import CatalogError
from bucketstore.engine.catalog import lmdb_file
from bucketstore.engine.catalog.lmdb_file import _Walk, _read_metas, check_data_file

FUZZ = int(os.environ.get("BUCKETSTORE_LMDB_FUZZ", "300"))
PAGE = 4096
_KEY = b"t\0#pulsar.internal.delayed.bucket_%d_%d"


def _catalog_like(path, keys=4000, big=20):
    """An LMDB environment shaped like the catalog: four named databases, thousands of keys,
    summaries beside them and a few values big enough for overflow pages."""
    env = lmdb.open(str(path), map_size=64 << 20, max_dbs=4)
    meta, trackers, buckets, summaries = (env.open_db(n) for n in (b"meta", b"trackers", b"buckets",
                                                                    b"summaries"))
    rng = random.Random(7)
    with env.begin(write=True) as txn:
        txn.put(b"format", b"2", db=meta)
        for i in range(keys):
            txn.put(_KEY % (i, i + 1), b"%d" % i, db=buckets)
            txn.put(_KEY % (i, i + 1), rng.randbytes(120), db=summaries)
        for i in range(big):
            txn.put(b"t%d" % i, rng.randbytes(9000), db=trackers)
    env.close()
    return path / "data.mdb"


def _short_after_bulk_delete(path):
    """The pattern of a tracker's clear(): many small commits, then one deleting every key. LMDB
    allocates pages in that transaction, frees them before commit and never writes them."""
    env = lmdb.open(str(path), map_size=64 << 20, max_dbs=4)
    a, b = env.open_db(b"buckets"), env.open_db(b"summaries")
    with env.begin(write=True) as txn:
        txn.put(b"t\0kept", b"1", db=a)
    for i in range(0, 2000, 10):
        with env.begin(write=True) as txn:
            for j in range(i, i + 10):
                txn.put(b"t\0k%05d" % j, b"%d" % j, db=a)
                txn.put(b"t\0k%05d" % j, b"s" * 150, db=b)
    with env.begin(write=True) as txn:
        for j in range(2000):
            txn.delete(b"t\0k%05d" % j, db=a)
            txn.delete(b"t\0k%05d" % j, db=b)
    env.close()
    return path / "data.mdb"


def _newer_meta_last_page(data) -> int:
    raw = data.read_bytes()
    metas = [struct.unpack_from("<QQ", raw, at + 136) for at in (0, PAGE)]
    return max(metas, key=lambda m: m[1])[0]


def _referenced(data, free_list: bool = True) -> set[int]:
    """The pages the trees reference (with or without the free list's, which only writers read)."""
    fd = os.open(data, os.O_RDONLY)
    try:
        size, page_size, _, roots = _read_metas(fd, str(data))
        walk = _Walk(fd, str(data), size, page_size)
        walk.trees(roots if free_list else roots[1:])
        return walk.seen
    finally:
        os.close(fd)


def _read_everything(path) -> dict[bytes, dict[bytes, bytes]]:
    env = lmdb.open(str(path), map_size=64 << 20, max_dbs=4, readonly=True)
    try:
        out = {}
        with env.begin() as txn:
            for name, _ in txn.cursor():
                db = env.open_db(name, txn=txn, create=False)
                out[name] = dict(txn.cursor(db=db))
        return out
    finally:
        env.close()


# -- healthy files ----------------------------------------------------------------------------

def test_a_file_ending_before_its_meta_pages_last_page_is_accepted_and_stays_writable(tmp_path):
    data = _short_after_bulk_delete(tmp_path)
    size = data.stat().st_size
    assert size < (_newer_meta_last_page(data) + 1) * PAGE  # what the old length check refused
    assert check_data_file(str(data)) == size
    assert _read_everything(tmp_path)[b"buckets"] == {b"t\0kept": b"1"}
    env = lmdb.open(str(tmp_path), map_size=64 << 20, max_dbs=4)  # a writer reuses the unwritten pages
    with env.begin(write=True) as txn:
        for j in range(500):
            txn.put(b"again%04d" % j, b"x" * 200, db=env.open_db(b"buckets", txn=txn))
    env.close()
    check_data_file(str(data))
    assert len(_read_everything(tmp_path)[b"buckets"]) == 501


def test_big_values_and_many_keys_are_walked_and_accepted(tmp_path):
    data = _catalog_like(tmp_path)
    pages = data.stat().st_size // PAGE
    seen = _referenced(data)
    assert len(seen) > 100 and max(seen) < pages  # the walk reached the named databases' pages
    assert check_data_file(str(data)) == data.stat().st_size


class _CountingPread:
    """The real ``os.pread``, counting its calls: how much work a check does, not how long it
    takes (the time is ``tools/bench/bench_catalog_check.py``'s to measure)."""

    def __init__(self) -> None:
        self.calls, self._real = 0, os.pread

    def __call__(self, fd: int, n: int, offset: int) -> bytes:
        self.calls += 1
        return self._real(fd, n, offset)


def test_checking_thousands_of_keys_reads_each_page_at_most_once(tmp_path, monkeypatch):
    data = _catalog_like(tmp_path, keys=4000)
    pages = data.stat().st_size // PAGE
    counter = _CountingPread()
    monkeypatch.setattr(lmdb_file.os, "pread", counter)
    check_data_file(str(data))
    # two meta pages, then one read per referenced page (an overflow run's header once): linear
    assert 2 < counter.calls <= pages + 2


def test_only_the_meta_page_lmdb_uses_is_walked(tmp_path):
    """LMDB reads through the meta page with the higher transaction id; the other one's
    root may name anything without harm, while the used one's may not."""
    data = _catalog_like(tmp_path, keys=200, big=0)
    raw = bytearray(data.read_bytes())
    (txn0,), (txn1,) = struct.unpack_from("<Q", raw, 144), struct.unpack_from("<Q", raw, PAGE + 144)
    newer, older = (PAGE, 0) if txn1 > txn0 else (0, PAGE)
    past_end = len(raw) // PAGE + 5
    older_bad = bytearray(raw)
    struct.pack_into("<Q", older_bad, older + 88 + 40, past_end)  # the older meta's main root
    data.write_bytes(bytes(older_bad))
    check_data_file(str(data))
    newer_bad = bytearray(raw)
    struct.pack_into("<Q", newer_bad, newer + 88 + 40, past_end)
    data.write_bytes(bytes(newer_bad))
    with pytest.raises(CatalogError) as info:
        check_data_file(str(data))
    assert info.value.offset == past_end * PAGE and info.value.path == str(data)


# -- real truncation: an error, not a signal ----------------------------------------------------

_CHECK_THEN_READ = textwrap.dedent("""
    import sys, lmdb
    from bucketstore import CatalogError
    from bucketstore.engine.catalog.lmdb_file import check_data_file
    if sys.argv[2] == "check":
        try:
            check_data_file(sys.argv[1] + "/data.mdb")
        except CatalogError as exc:
            print("CatalogError", exc.offset, exc)
            sys.exit(3)
    env = lmdb.open(sys.argv[1], map_size=64 << 20, max_dbs=4, readonly=True)
    with env.begin() as txn:
        for name, _ in txn.cursor():
            for _ in txn.cursor(db=env.open_db(name, txn=txn, create=False)):
                pass
    print("read everything")
""")


@pytest.mark.parametrize("cut", ["last referenced page", "a partial page"])
def test_a_missing_referenced_page_is_a_catalog_error_where_lmdb_would_die_of_sigbus(tmp_path, cut):
    data = _catalog_like(tmp_path, keys=2000, big=5)
    last = max(_referenced(data, free_list=False))  # a page a reader needs
    size = last * PAGE + (PAGE // 2 if cut == "a partial page" else 0)
    with open(data, "r+b") as f:
        f.truncate(size)

    def run(mode):
        return subprocess.run([sys.executable, "-c", _CHECK_THEN_READ, str(tmp_path), mode],
                              capture_output=True, text=True, timeout=60)

    unguarded = run("no check")  # LMDB alone: the signal this check exists for
    if cut == "a partial page":  # the page's tail maps as zeros: LMDB reads garbage instead
        assert unguarded.returncode != 0, unguarded.stdout
    else:
        assert unguarded.returncode == -signal.SIGBUS, (unguarded.returncode, unguarded.stdout, unguarded.stderr)
    guarded = run("check")
    assert guarded.returncode == 3, (guarded.returncode, guarded.stdout, guarded.stderr)
    _, offset, message = guarded.stdout.split(" ", 2)
    assert int(offset) >= last * PAGE
    assert message.startswith(f"{data}: offset {offset}: page ") and "truncated" in message


# -- hostile bytes --------------------------------------------------------------------------------

def _pages_with(raw: bytes, flag: int) -> list[int]:
    return [n for n in range(2, len(raw) // PAGE) if struct.unpack_from("<H", raw, n * PAGE + 10)[0] & flag]


def _assert_refused(data, raw: bytes, offset: int | None = None) -> None:
    data.write_bytes(raw)
    with pytest.raises(CatalogError) as info:
        check_data_file(str(data))
    if offset is not None:
        assert info.value.offset == offset, str(info.value)


def test_crafted_damage_is_refused_with_the_page_offset(tmp_path):
    data = _catalog_like(tmp_path, keys=4000, big=5)
    raw = data.read_bytes()
    seen = _referenced(data)
    branch = next(n for n in _pages_with(raw, 0x01) if n in seen)
    leaf = next(n for n in _pages_with(raw, 0x02) if n in seen)
    overflow = next(n for n in _pages_with(raw, 0x04) if n in seen)
    at = branch * PAGE

    def patched(offset, fmt, *values):
        out = bytearray(raw)
        struct.pack_into(fmt, out, offset, *values)
        return bytes(out)

    first_node = struct.unpack_from("<H", raw, at + 16)[0]
    # A branch naming a child far past the end (the child's number spans lo, hi and flags).
    _assert_refused(data, patched(at + first_node, "<HHH", 0, 0, 0x100), offset=(0x100 << 32) * PAGE)
    # Bounds that cannot be: lower past upper, node offsets outside the page.
    _assert_refused(data, patched(at + 12, "<HH", 4000, 100), offset=at)
    _assert_refused(data, patched(at + 16, "<H", PAGE - 2), offset=at)
    # A page whose header names another page, or is not a tree page.
    _assert_refused(data, patched(leaf * PAGE, "<Q", leaf + 1), offset=leaf * PAGE)
    _assert_refused(data, patched(leaf * PAGE + 10, "<H", 0x08), offset=leaf * PAGE)
    # An overflow run longer than the file.
    _assert_refused(data, patched(overflow * PAGE + 12, "<I", 10**6), offset=(overflow + 10**6 - 1) * PAGE)
    # A cycle (a branch naming itself) ends: the page is read once.
    data.write_bytes(patched(at + first_node, "<HHH", branch & 0xFFFF, branch >> 16, 0))
    try:
        check_data_file(str(data))
    except CatalogError:
        pass


def test_random_damage_is_accepted_or_a_catalog_error_never_anything_else(tmp_path, monkeypatch):
    data = _catalog_like(tmp_path, keys=1500, big=5)
    raw = data.read_bytes()
    pages = sorted(p for p in _referenced(data))
    rng = random.Random(2024)
    refused = 0
    counter = _CountingPread()
    monkeypatch.setattr(lmdb_file.os, "pread", counter)
    for _ in range(FUZZ):
        damaged = bytearray(raw)
        page = rng.choice(pages)
        for _ in range(rng.randint(1, 8)):
            # Mostly the header and the node offsets and headers, where the walk decides things.
            spot = page * PAGE + rng.choice([rng.randrange(0, 64), rng.randrange(PAGE)])
            damaged[spot] = rng.randrange(256)
        data.write_bytes(bytes(damaged))
        try:
            check_data_file(str(data))
        except CatalogError as exc:
            refused += 1
            assert exc.path == str(data) and exc.offset is not None
    assert refused > FUZZ // 10
    assert counter.calls <= FUZZ * (len(raw) // PAGE + 2)  # no input makes the walk read a page twice


def test_a_live_writer_committing_meanwhile_is_never_refused(tmp_path):
    """The walk reads pages no LMDB reader pins: a writer committing all along may reuse them
    under it. A changed transaction id makes it look again, so a healthy file is never refused."""
    data = _catalog_like(tmp_path, keys=3000, big=3)
    env = lmdb.open(str(tmp_path), map_size=64 << 20, max_dbs=4)
    db = env.open_db(b"buckets")
    stop = threading.Event()
    commits = [0]

    def write():
        rng = random.Random(3)
        while not stop.is_set():
            with env.begin(write=True) as txn:  # churn: deletes and re-puts reuse freed pages
                for _ in range(50):
                    i = rng.randrange(3000)
                    txn.delete(_KEY % (i, i + 1), db=db)
                    txn.put(_KEY % (i, i + 1), rng.randbytes(rng.randrange(1, 300)), db=db)
            commits[0] += 1

    writer = threading.Thread(target=write)
    writer.start()
    try:
        deadline = time.monotonic() + 2.0
        checks = 0
        while time.monotonic() < deadline or checks < 50:
            check_data_file(str(data))
            checks += 1
    finally:
        stop.set()
        writer.join()
        env.close()
    assert commits[0] > 10, "the writer did not commit meanwhile"
