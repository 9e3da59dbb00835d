"""``verify`` after a crash: the files a crash leaves, which the next open removes, are warnings.

Found by killing writers (SIGKILL) and running ``bucketstore verify`` on what they left: a seal
killed between its file's rename and its catalog commit leaves an unreferenced ledger file, and
``verify`` exited 1 with "1 problem(s)", although the next open removes the file by itself and
``Finding``'s own contract (and docs/api.md) calls such a file a warning. An unreferenced file
that open would *keep* (unreadable, or another ledger's) is still damage.
"""

from __future__ import annotations

import errno
import os
import shutil

import bucketstore
from bucketstore import TrackerConfig
from bucketstore.cli import commands as cli
from bucketstore.engine.store.store import Store
from bucketstore.format.ledger_file import ledger_file_name
from bucketstore.testing.faults import FaultyFileSystem

from helpers import FakeClock

CONFIG = TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=4, max_indexes_per_segment=3)


def _store_with_an_orphan(path) -> str:
    """A store whose drained bucket's unlink failed: its key is gone and its file stays, as a
    crash between a deletion's catalog commit and its unlink leaves it. Returns the file."""
    fs = FaultyFileSystem()
    store = Store(path, durability="sealed", fs=fs, background=False)
    fs.attach(store.catalog)
    clock = FakeClock(1_000)
    tracker = store.tracker("sub", CONFIG, clock)
    for ledger in (1, 2):
        tracker.add_messages([(ledger, e, 2_000 + 10 * e + ledger) for e in range(6)])
    (orphan,) = [os.path.join(path, "ledgers", f) for f in os.listdir(os.path.join(path, "ledgers"))]
    fs.fail(errno.EIO, ops=["unlink"], times=1)
    clock.advance(10_000)
    tracker.get_scheduled_messages(100)
    assert store.catalog.buckets("sub") == {} and os.path.exists(orphan)  # key gone, file stuck
    store.close()
    return orphan


def test_files_open_removes_are_warnings(tmp_path, capsys) -> None:
    path = str(tmp_path / "s")
    orphan = _store_with_an_orphan(path)
    temporary = os.path.join(path, "ledgers", "00000000000000000099.ledger.tmp")
    with open(temporary, "wb") as f:
        f.write(b"half a seal")
    report = bucketstore.check(path)
    assert report.ok and report.damage == []
    assert sorted(f.path for f in report.warnings) == sorted([orphan, temporary])
    assert cli.main(["verify", path]) == 0
    assert "warning: " + orphan in capsys.readouterr().out
    with bucketstore.open(path, durability="sealed") as store:  # ... and open removes both
        assert store.orphans_removed == 2
    assert os.listdir(os.path.join(path, "ledgers")) == []


def test_an_orphan_open_keeps_is_damage(tmp_path) -> None:
    path = str(tmp_path / "s")
    orphan = _store_with_an_orphan(path)
    other = os.path.join(path, "ledgers", ledger_file_name(77))
    shutil.copyfile(orphan, other)  # its header names another ledger
    with open(orphan, "r+b") as f:
        f.seek(40)
        byte = f.read(1)
        f.seek(40)
        f.write(bytes([byte[0] ^ 0xFF]))  # the header's CRC fails
    report = bucketstore.check(path)
    assert not report.ok
    assert {f.path for f in report.damage} == {orphan, other}
    assert cli.main(["verify", path]) == 1
    with bucketstore.open(path, durability="sealed") as store:  # open keeps both, as verify said
        assert len(store.orphans_kept) == 2
