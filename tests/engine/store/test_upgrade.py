"""Version-1 and version-2 stores: they open and deliver as written, and `bucketstore upgrade` rewrites
them in place in the current version.

A v1 store is made the way an old release left it: a tracker seals buckets,
then each bucket file is rewritten byte for byte as the version-1 writer
would have written it (same ledger id, same cuts, per-segment bitmaps, zlib);
a v2 store likewise with the version-2 writer (bucket-wide bitmaps, not shuffled).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import bucketstore
from bucketstore import TrackerConfig
from bucketstore.cli import commands as cli
from bucketstore.engine.catalog.catalog import Catalog
from bucketstore.engine.store.upgrade import upgrade_store
from bucketstore.format.ledger_file import ledger_file_name
from bucketstore.format.snapshot import SNAPSHOT_VERSION, BucketFile, build_bucket, write_bucket
from bucketstore.checking.store_check import verify_store

from helpers import as_format1_catalog

EPOCH = 1_700_000_000_000


def _store_with_buckets(path: str, seed: int = 3) -> list[tuple[int, int, int]]:
    """Seal three buckets of random-delay indexes; return every (ts, ledger, entry) held."""
    rng = np.random.default_rng(seed)
    rows = []
    with bucketstore.open(path, durability="sealed") as store:  # the last ledger is never sealed: not kept
        t = store.tracker("t", TrackerConfig(max_indexes_per_segment=300, min_index_count_per_bucket=1),
                          lambda: EPOCH)
        for ledger in range(4):
            at = EPOCH + 1_000 + rng.integers(0, 600_000, 1_000).astype(np.uint64)
            ents = np.arange(1_000, dtype=np.uint64)
            t.add_messages((np.full(1_000, ledger, np.uint64), ents, at))
            rows += zip(at.tolist(), [ledger] * 1_000, ents.tolist())
        t.flush()
    return sorted(rows)


def _sealed_positions(path: str) -> list[tuple[int, int]]:
    """Every (ledger, entry) in the store's bucket files."""
    out = []
    for name in sorted(os.listdir(os.path.join(path, "ledgers"))):
        with BucketFile(os.path.join(path, "ledgers", name)) as bucket:
            for n in range(1, bucket.segment_count + 1):
                seg = bucket.read_segment(n)
                out += zip(seg.ledger_ids.tolist(), seg.entry_ids.tolist())
    return sorted(out)


def _rewrite_as_old(path: str, version: int = 1) -> int:
    """Rewrite every bucket file of the store as ``version`` (same ledger id); return how many."""
    ledgers_dir = os.path.join(path, "ledgers")
    with Catalog(os.path.join(path, "catalog"), readonly=True) as catalog:
        ids = [lid for keys in catalog.all_buckets().values() for lid in keys.values()]
    for lid in ids:
        file = os.path.join(ledgers_dir, ledger_file_name(lid))
        with BucketFile(file) as bucket:
            meta = bucket.metadata
            props = {k: v for k, v in bucket.ledger.properties.items()
                     if k not in ("kind", "bucket_key", "start_ledger", "end_ledger")}
            segs = [bucket.read_segment(n) for n in range(1, bucket.segment_count + 1)]
        cols = [np.concatenate([getattr(s, c) for s in segs]) for c in ("timestamps", "ledger_ids", "entry_ids")]
        old, payloads = build_bucket(meta.start_ledger, meta.end_ledger, *cols, time_step_ms=1 << 62,
                                     max_indexes_per_segment=300, version=version)
        assert [s.count for s in old.segments] == [s.count for s in meta.segments]
        os.unlink(file)
        write_bucket(ledgers_dir, lid, old, payloads, props)
        with BucketFile(file) as bucket:
            assert bucket.metadata.version == version
    as_format1_catalog(path)  # and its catalog as that release wrote it: no bucket summaries
    return len(ids)


def _versions(path: str) -> list[int]:
    out = []
    for name in sorted(os.listdir(os.path.join(path, "ledgers"))):
        with BucketFile(os.path.join(path, "ledgers", name)) as bucket:
            out.append(bucket.metadata.version)
    return out


def _drain(path: str) -> list[tuple[int, int, int]]:
    got = []
    now = [EPOCH]
    with bucketstore.open(path) as store:
        t = store.tracker("t", TrackerConfig(max_indexes_per_segment=300), lambda: now[0])
        assert t.contains_message(0, 5)
        now[0] = EPOCH + 10**9
        while True:
            batch = t.get_scheduled_messages(10**6)
            if not batch:
                break
            got += batch
    return got


@pytest.fixture()
def v1_store(tmp_path):
    path = str(tmp_path / "s")
    _store_with_buckets(path)
    expected = _sealed_positions(path)
    assert _rewrite_as_old(path) >= 1 and len(expected) >= 2_000
    return path, expected


def test_v1_store_opens_and_delivers_everything(v1_store) -> None:
    path, rows = v1_store
    assert set(_versions(path)) == {1}
    findings = verify_store(path)[0]
    assert findings and all(f.warning and "no bucket summary" in f.message for f in findings)  # format-1 catalog
    got = _drain(path)
    assert sorted(got) == rows


def test_upgrade_rewrites_every_bucket_and_keeps_the_content(v1_store, capsys) -> None:
    path, rows = v1_store
    before = len(_versions(path))
    assert cli.main(["upgrade", path]) == 0
    out = capsys.readouterr().out
    assert f"upgraded {before} bucket(s)" in out and "0 failed" in out
    assert _versions(path) == [SNAPSHOT_VERSION] * before  # the old files are gone, not left beside the new
    assert verify_store(path)[0] == []
    assert cli.main(["upgrade", path]) == 0  # idempotent
    assert f"0 bucket(s); {before} already current" in capsys.readouterr().out
    got = _drain(path)
    assert sorted(got) == rows


def test_upgrade_failing_at_the_catalog_commit_leaves_the_v1_bucket(v1_store, monkeypatch) -> None:
    path, rows = v1_store
    files_before = sorted(os.listdir(os.path.join(path, "ledgers")))

    def refuse(self, *args, **kwargs):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(Catalog, "commit", refuse)
    report = upgrade_store(path)
    monkeypatch.undo()
    assert report.upgraded == 0 and len(report.failed) == len(files_before)
    assert sorted(os.listdir(os.path.join(path, "ledgers"))) == files_before  # new files removed
    got = _drain(path)
    assert sorted(got) == rows


def test_upgrade_crash_after_the_new_file_is_durable(v1_store, monkeypatch) -> None:
    """A crash between the durable new file and the commit: the next open removes the orphan."""
    path, rows = v1_store

    class Crash(BaseException):
        pass

    def crash(self, *args, **kwargs):
        raise Crash()
    monkeypatch.setattr(Catalog, "commit", crash)
    import bucketstore.engine.store.store as store_mod
    monkeypatch.setattr(store_mod.Store, "remove_ledger_file", lambda self, p: None)  # died: no cleanup
    with pytest.raises(Crash):
        upgrade_store(path)
    monkeypatch.undo()
    assert SNAPSHOT_VERSION in _versions(path)  # the orphan new file is on disk
    bucketstore.open(path).close()  # opening removes it; the v1 bucket is still the one in the catalog
    assert set(_versions(path)) == {1}
    assert sorted(_drain(path)) == rows


def test_upgrade_refuses_an_open_store(v1_store, capsys) -> None:
    path, _ = v1_store
    with bucketstore.open(path):
        assert cli.main(["upgrade", path]) == 1
    assert "close it before upgrading" in capsys.readouterr().err


@pytest.mark.parametrize("version", [2, 3, 4, 5])
def test_upgrade_rewrites_a_v2_to_v5_store_as_current_keeping_every_row(tmp_path, capsys, version) -> None:
    """Versions 3 to 5 changed only entry 0's layout of the bitmaps, version 6 added grouped
    segments: a v2 to v5 store verifies as it is, and upgrading it rewrites each bucket with
    the same rows."""
    path = str(tmp_path / "s")
    _store_with_buckets(path)
    rows = _sealed_positions(path)
    count = _rewrite_as_old(path, version=version)
    assert set(_versions(path)) == {version}
    assert all(f.warning and "no bucket summary" in f.message for f in verify_store(path)[0])
    assert cli.main(["upgrade", path]) == 0
    out = capsys.readouterr().out
    assert f"upgraded {count} bucket(s)" in out and "0 failed" in out
    assert _versions(path) == [SNAPSHOT_VERSION] * count == [6] * count
    assert _sealed_positions(path) == rows
    assert verify_store(path)[0] == []
    assert sorted(_drain(path)) == rows
