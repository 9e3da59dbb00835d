"""Integrity of a store's files (issue 14): a lost or truncated catalog deletes nothing and
kills nothing, every file proves whose it is, and repair drops only proven damage.

All of it on real files: a real LMDB catalog cut, emptied or replaced, ledger files
swapped between trackers, journals copied between trackers, and (for SIGBUS and
permissions) real subprocesses.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest
from helpers import FakeClock

import bucketstore
from bucketstore import CatalogError, CorruptLedgerError, JournalError, LedgerIdentityError
from bucketstore.cli.commands import main
from helpers import SMALL, fill_and_seal, prefix_positions

def _files(path):
    """Every file under the store except the catalog and the lock, with its bytes."""
    out = {}
    for root, _, names in os.walk(path):
        if os.path.basename(root).startswith("catalog") or root.startswith(str(path / "catalog")):
            continue
        for name in names:
            if name != "LOCK":
                p = os.path.join(root, name)
                out[os.path.relpath(p, path)] = open(p, "rb").read()
    return out


def _two_tracker_store(path, durability="sealed"):
    clock = FakeClock(0)
    with bucketstore.open(path, durability) as store:
        fill_and_seal(store.tracker("a", SMALL, clock))
        fill_and_seal(store.tracker("b", SMALL, clock), base=2000)
        return getattr(store, "store_id", None)


def _delivered_everything(path, durability="sealed"):
    with bucketstore.open(path, durability) as store:
        out = {}
        for name in store.trackers():
            clock = FakeClock(0)  # nothing due at recovery (sealed mode skips due segments, as Pulsar does)
            t = store.tracker(name, SMALL, clock)
            clock.now = 10**9
            out[name] = sorted(t.get_scheduled_messages(10**6))
        return out


# -- 1. a lost catalog --------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["empty", "missing", "no catalog dir", "new catalog"])
@pytest.mark.parametrize("durability", ["sealed", "journal"])
def test_a_lost_catalog_is_an_error_and_deletes_nothing(tmp_path, how, durability):
    path = tmp_path / "s"
    _two_tracker_store(path, durability)
    before = _files(path)
    data = path / "catalog" / "data.mdb"
    if how == "empty":
        data.write_bytes(b"")
    elif how == "missing":
        data.unlink()
    elif how == "no catalog dir":
        shutil.rmtree(path / "catalog")
    else:  # a brand-new LMDB environment in place of the real one
        shutil.rmtree(path / "catalog")
        import lmdb
        lmdb.open(str(path / "catalog"), max_dbs=4).close()
    for _ in range(2):  # and a second attempt finds the same: nothing was created in between
        with pytest.raises(CatalogError) as info:
            bucketstore.open(path, durability)
        assert "catalog" in str(info.value) and info.value.path.startswith(str(path / "catalog"))
    assert _files(path) == before
    assert main(["verify", str(path)]) == 1


def test_a_lost_catalog_of_a_journal_only_store_is_an_error(tmp_path):
    """No sealed file at all: the journal alone holds the data, and still nothing is lost."""
    path = tmp_path / "s"
    with bucketstore.open(path, "journal") as store:
        store.tracker("a", SMALL, FakeClock(0)).add_message(1, 1, 500)
    before = _files(path)
    assert not os.listdir(path / "ledgers")
    (path / "catalog" / "data.mdb").write_bytes(b"")
    with pytest.raises(CatalogError):
        bucketstore.open(path, "journal")
    assert _files(path) == before


def test_a_catalog_of_another_store_deletes_nothing(tmp_path):
    """A healthy catalog that is not these files' catalog: unreferenced files of another store
    are never garbage."""
    path, other = tmp_path / "s", tmp_path / "other"
    _two_tracker_store(path)
    with bucketstore.open(other) as store:
        store.tracker("z", SMALL, FakeClock(0))
    before = _files(path)
    shutil.rmtree(path / "catalog")
    shutil.copytree(other / "catalog", path / "catalog")
    with pytest.raises(CatalogError, match="belongs to store"):
        bucketstore.open(path)
    assert _files(path) == before


@pytest.mark.parametrize("durability", ["sealed", "journal"])
def test_rebuild_catalog_restores_every_bucket_and_keeps_every_file(tmp_path, durability):
    path = tmp_path / "s"
    store_id = _two_tracker_store(path, durability)
    with bucketstore.open(path, durability) as store:
        keys = {name: store.catalog.buckets(name) for name in store.trackers()}
        next_id = store.catalog.next_ledger_id()
    before = _files(path)
    (path / "catalog" / "data.mdb").write_bytes(b"")
    assert main(["repair", "--rebuild-catalog", str(path)]) == 0
    assert _files(path) == before
    assert any(n.startswith("catalog.broken-") for n in os.listdir(path))  # the old one is kept aside
    with bucketstore.open(path, durability) as store:
        assert store.store_id == store_id
        assert {name: store.catalog.buckets(name) for name in store.trackers()} == keys
        assert store.catalog.next_ledger_id() >= next_id
        assert store.stats()["orphans_removed_on_open"] == 0
    # Every sealed index comes back (and, in journal mode, the mutable bucket's too).
    got = _delivered_everything(path, durability)
    assert len(got["a"]) >= 36 and len(got["b"]) >= 36
    assert main(["verify", str(path)]) == 0


def test_rebuild_refuses_a_healthy_catalog_and_files_of_two_stores(tmp_path, capsys):
    path = tmp_path / "s"
    _two_tracker_store(path)
    assert main(["repair", "--rebuild-catalog", str(path)]) == 0  # healthy: nothing to do is success
    assert "nothing to rebuild" in capsys.readouterr().out
    other = tmp_path / "o"
    _two_tracker_store(other)
    foreign = sorted(os.listdir(other / "ledgers"))[0]
    shutil.copy(other / "ledgers" / foreign, path / "ledgers" / f"{900:020d}.ledger")
    os.rename(path / "catalog", path / "lost")
    assert main(["repair", "--rebuild-catalog", str(path)]) == 1
    assert "2 stores" in capsys.readouterr().err
    assert main(["repair", str(path)]) == 2  # the action must be explicit


# -- 2. a truncated catalog: an error, never SIGBUS -----------------------------------------------

_OPEN_SCRIPT = textwrap.dedent("""
    import sys
    import bucketstore
    try:
        with bucketstore.open(sys.argv[1]) as store:
            store.tracker("a").stats()
    except bucketstore.CatalogError as exc:
        print("CatalogError:", exc)
        sys.exit(3)
""")


@pytest.mark.parametrize("cut", ["8KiB", "half", "100 bytes", "meta page damaged"])
def test_a_truncated_catalog_is_a_typed_error_not_a_signal(tmp_path, cut):
    path = tmp_path / "s"
    clock = FakeClock(0)
    with bucketstore.open(path) as store:
        t = store.tracker("a", SMALL, clock)
        for i in range(40):  # enough commits to grow data.mdb well past its two meta pages
            fill_and_seal(t, base=1000 + i * 10_000, ledgers=1)
            t.mark_delete(0, i)
    data = path / "catalog" / "data.mdb"
    raw = data.read_bytes()
    assert len(raw) > 16384
    if cut == "8KiB":
        data.write_bytes(raw[:8192])
    elif cut == "half":
        data.write_bytes(raw[:len(raw) // 2])
    elif cut == "100 bytes":
        data.write_bytes(raw[:100])
    else:
        damaged = bytearray(raw)
        damaged[16:20] = b"\0\0\0\0"  # meta page 0's magic
        data.write_bytes(bytes(damaged))
    before = _files(path)
    run = subprocess.run([sys.executable, "-c", _OPEN_SCRIPT, str(path)], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 3, (run.returncode, run.stdout, run.stderr)
    assert str(data) in run.stdout
    for command in ("verify", "catalog", "stats", "dump"):
        cli = subprocess.run([sys.executable, "-m", "bucketstore", command, str(path)], capture_output=True,
                             text=True, timeout=120)
        assert cli.returncode == 1, (command, cli.returncode, cli.stdout, cli.stderr)
        assert "Traceback" not in cli.stderr + cli.stdout
        assert len((cli.stderr or "").strip().splitlines()) <= 1
    assert _files(path) == before


# -- 3. identity ----------------------------------------------------------------------------------

def _bucket_files(store, name):
    return [store.ledger_path(lid) for _, lid in sorted(store.catalog.buckets(name).items())]


@pytest.mark.parametrize("repair", [False, True])
def test_swapped_ledger_files_are_refused_naming_both(tmp_path, repair):
    path = tmp_path / "s"
    _two_tracker_store(path)
    with bucketstore.open(path) as store:
        fa, fb = _bucket_files(store, "a")[0], _bucket_files(store, "b")[0]
    tmp = fa + ".swap"
    os.rename(fa, tmp)
    os.rename(fb, fa)
    os.rename(tmp, fb)
    before = _files(path)
    with bucketstore.open(path, "sealed", repair=repair) as store:  # sealed: no journal file is written either
        with pytest.raises(LedgerIdentityError) as info:
            # repair opens every bucket at once; otherwise the first that needs it finds it (a
            # position a summary's prefix holds is the index's to answer: one past it)
            t = store.tracker("a", SMALL, FakeClock(0))
            t.contains_message(*next(p for p in ((0, e) for e in range(12)) if p not in prefix_positions(t)))
        msg = str(info.value)
        assert "tracker 'a'" in msg and "header says tracker 'b'" in msg and "header says ledger" in msg
    with bucketstore.open(path) as store:  # repair dropped nothing: the keys and files stay
        assert store.catalog.buckets("a") and store.catalog.buckets("b")
    assert _files(path) == before
    assert main(["verify", str(path)]) == 1


def test_a_file_swapped_after_open_is_refused_at_segment_load(tmp_path):
    path = tmp_path / "s"
    _two_tracker_store(path)
    clock = FakeClock(0)
    with bucketstore.open(path) as store:
        a = store.tracker("a", SMALL, clock)  # nothing due yet: no segment is loaded
        assert a.contains_message(0, 0)  # answered from a copy of entry 0 (the bucket may stay unopened)
        b_file, a_file = _bucket_files(store, "b")[0], _bucket_files(store, "a")[0]
        shutil.copy(b_file, a_file)  # intact, but another tracker's ledger
        clock.now = 10**9
        # Entry 0 is read (and its header checked) when the bucket opens: before the swap when the
        # open-ahead thread got to it first, then the segment read finds another ledger; after it,
        # then the header disagrees with the catalog. Either way a typed refusal naming the file.
        # (Batches of rows the summaries' prefixes hold, if any, come first: no file is read for them.)
        with pytest.raises((CorruptLedgerError, LedgerIdentityError),
                           match="catalog entry is ledger|disagrees with the file") as info:
            for _ in range(1 + len(prefix_positions(a))):
                a.get_scheduled_messages(1000)
        assert info.value.path == a_file


def test_a_foreign_journal_is_refused(tmp_path):
    path = tmp_path / "s"
    with bucketstore.open(path, "journal") as store:
        store.tracker("a", SMALL, FakeClock(0)).add_message(1, 1, 500)
        store.tracker("b", SMALL, FakeClock(0)).add_message(7, 7, 700)
    from bucketstore.engine.durability.journal import journal_directory
    da, db = journal_directory(str(path), "a"), journal_directory(str(path), "b")
    for name in os.listdir(db):
        os.unlink(os.path.join(db, name))
    for name in os.listdir(da):
        shutil.copy(os.path.join(da, name), os.path.join(db, name))
    with bucketstore.open(path, "journal") as store:
        assert store.tracker("a", SMALL, FakeClock(0)).contains_message(1, 1)
        with pytest.raises(JournalError, match="foreign journal"):
            store.tracker("b", SMALL, FakeClock(0))


def test_a_journal_of_another_store_is_refused(tmp_path):
    path, other = tmp_path / "s", tmp_path / "o"
    for p in (path, other):
        with bucketstore.open(p, "journal") as store:
            store.tracker("a", SMALL, FakeClock(0)).add_message(1, 1, 500)
    from bucketstore.engine.durability.journal import journal_directory
    shutil.rmtree(journal_directory(str(path), "a"))
    shutil.copytree(journal_directory(str(other), "a"), journal_directory(str(path), "a"))
    with bucketstore.open(path, "journal") as store:
        with pytest.raises(JournalError, match="of store"):
            store.tracker("a", SMALL, FakeClock(0))


# -- 4. repair drops only proven damage -------------------------------------------------------------

_REPAIR_AS_NOBODY = textwrap.dedent("""
    import os, sys
    import bucketstore
    from bucketstore import TrackerConfig
    cfg = TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=10, max_indexes_per_segment=4)
    if os.getuid() == 0:  # root reads any file: act as an unprivileged user
        os.setgid(65534)
        os.setuid(65534)
    try:
        with bucketstore.open(sys.argv[1], repair=True) as store:
            store.tracker("a", cfg)
    except PermissionError as exc:
        print("PermissionError", exc.filename)
        sys.exit(3)
""")


def test_repair_does_not_drop_a_file_it_cannot_open(tmp_path):
    import tempfile
    base = tempfile.mkdtemp(dir="/tmp")
    try:
        os.chmod(base, 0o755)
        path = os.path.join(base, "s")
        with bucketstore.open(path) as store:
            fill_and_seal(store.tracker("a", SMALL, FakeClock(0)))
            keys = store.catalog.buckets("a")
            victim = _bucket_files(store, "a")[0]
        if os.getuid() == 0:
            for root, dirs, files in os.walk(path):
                for n in dirs + files:
                    os.chown(os.path.join(root, n), 65534, 65534)
            os.chown(path, 65534, 65534)
        os.chmod(victim, 0)
        run = subprocess.run([sys.executable, "-c", _REPAIR_AS_NOBODY, path], capture_output=True, text=True,
                             timeout=120)
        assert run.returncode == 3 and victim in run.stdout, (run.returncode, run.stdout, run.stderr)
        os.chmod(victim, 0o644)
        with bucketstore.open(path) as store:
            assert store.catalog.buckets("a") == keys  # the key stayed
            assert store.tracker("a", SMALL, FakeClock(0)).stats()["immutable_buckets"] == len(keys)
    finally:
        shutil.rmtree(base)
