"""Limits and small contracts (issue 14): long tracker names, thousands of journal trackers
under a low descriptor limit, TrackerConfig ranges, bad store paths, use after close,
delete_tracker beside in-flight work, and strict delivery with precision_bits."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import pytest
from helpers import FakeClock

import bucketstore
from bucketstore import StoreClosedError, TrackerConfig
from bucketstore.engine.durability.journal import journal_directory

SMALL = TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=10, max_indexes_per_segment=4)


# -- tracker names and journal directories ------------------------------------------------------

@pytest.mark.parametrize("name", ["x" * 200, "é" * 100, "../../etc/passwd", ".hidden", "a/b\\c d", "-"])
@pytest.mark.parametrize("durability", ["sealed", "journal"])
def test_any_valid_tracker_name_works_in_both_modes(tmp_path, name, durability):
    path = tmp_path / "s"
    with bucketstore.open(path, durability) as store:
        store.tracker(name, SMALL, FakeClock(0)).add_message(1, 1, 500)
    with bucketstore.open(path, durability) as store:
        assert store.tracker(name, SMALL, FakeClock(0)).contains_message(1, 1) == (durability == "journal")
        assert store.trackers() == [name]
    directory = journal_directory(str(path), name)
    assert os.path.dirname(directory) == str(path / "journal") and len(os.path.basename(directory)) <= 65
    assert os.path.isdir(directory) == (durability == "journal")


def test_a_journal_directory_of_an_older_store_is_still_used(tmp_path):
    path = tmp_path / "s"
    with bucketstore.open(path, "journal") as store:
        store.tracker("sub", SMALL, FakeClock(0)).add_message(1, 1, 500)
    os.rename(journal_directory(str(path), "sub"), path / "journal" / b"sub".hex())  # the old naming
    with bucketstore.open(path, "journal") as store:
        assert store.tracker("sub", SMALL, FakeClock(0)).contains_message(1, 1)
    assert os.listdir(path / "journal") == [b"sub".hex()]


_MANY_TRACKERS = textwrap.dedent("""
    import os, resource, sys
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    import bucketstore
    from bucketstore import TrackerConfig
    n = int(sys.argv[2])
    cfg = TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=10)
    with bucketstore.open(sys.argv[1], "journal") as store:
        for i in range(n):
            store.tracker(f"t{i}", cfg, clock=lambda: 0).add_message(1, i, 10**6)
        for i in range(n):  # every journal is written again: descriptors come back through the pool
            store.tracker(f"t{i}", cfg, clock=lambda: 0).add_message(2, i, 10**6)
        assert len(os.listdir("/proc/self/fd")) < 128, len(os.listdir("/proc/self/fd"))
    with bucketstore.open(sys.argv[1], "journal") as store:
        missing = [i for i in range(n) if not store.tracker(f"t{i}", cfg, clock=lambda: 0).contains_message(2, i)]
    print("missing", len(missing))
""")


def test_thousands_of_journal_trackers_under_a_256_descriptor_limit(tmp_path):
    n = int(os.environ.get("BUCKETSTORE_MANY_TRACKERS", 1500))
    run = subprocess.run([sys.executable, "-c", _MANY_TRACKERS, str(tmp_path / "s"), str(n)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "missing 0"


# -- TrackerConfig ------------------------------------------------------------------------------

INT_FIELDS = ["tick_time_ms", "min_index_count_per_bucket", "max_time_step_per_segment_ms",
              "max_indexes_per_segment", "max_num_buckets", "precision_bits"]


@pytest.mark.parametrize("field", INT_FIELDS)
@pytest.mark.parametrize("value", [2**64, 2**63, 2**100, -2, -(2**64)])
def test_config_out_of_range_is_a_value_error_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        TrackerConfig(**{field: value})


@pytest.mark.parametrize("field", INT_FIELDS + ["deliver_at_time_strict"])
@pytest.mark.parametrize("value", [1.0, "1", None, b"1", [1]])
def test_config_of_the_wrong_type_is_a_type_error_naming_the_field(field, value):
    with pytest.raises(TypeError, match=field):
        TrackerConfig(**{field: value})


def test_config_largest_values_work_end_to_end(tmp_path):
    big = TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=2**63 - 1,
                        max_time_step_per_segment_ms=2**63 - 1, max_indexes_per_segment=2**63 - 1,
                        max_num_buckets=2**63 - 1)
    with bucketstore.open(tmp_path / "s") as store:
        t = store.tracker("t", big, FakeClock(0))
        t.add_message(1, 1, 10)
    with bucketstore.open(tmp_path / "s") as store:
        # journal mode, the default: the acknowledged add survives though no bucket was sealed
        assert store.tracker("t", big, FakeClock(0)).number_of_delayed_messages == 1


# -- store paths and use after close --------------------------------------------------------------

def test_empty_store_path_is_refused_and_creates_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="empty"):
        bucketstore.open("")
    assert os.listdir(tmp_path) == []


def test_a_regular_file_as_store_path_is_a_clear_error(tmp_path):
    f = tmp_path / "f"
    f.write_text("not a store")
    with pytest.raises(ValueError, match="not a directory"):
        bucketstore.open(f)
    assert f.read_text() == "not a store"


def test_tracker_and_store_figures_after_close_raise(tmp_path):
    store = bucketstore.open(tmp_path / "s")
    t = store.tracker("t", SMALL, FakeClock(0))
    t.add_message(1, 1, 100)
    t.close()
    with pytest.raises(StoreClosedError):
        t.stats()
    with pytest.raises(StoreClosedError):
        t.number_of_delayed_messages  # noqa: B018
    store.close()
    with pytest.raises(StoreClosedError):
        store.stats()


# -- delete_tracker beside in-flight work -----------------------------------------------------------

def test_delete_tracker_waits_for_in_flight_work_and_leaves_nothing(tmp_path):
    for attempt in range(int(os.environ.get("BUCKETSTORE_DELETE_RACES", 20))):
        path = tmp_path / f"s{attempt}"
        with bucketstore.open(path) as store:
            t = store.tracker("t", SMALL, FakeClock(0))
            started = threading.Event()
            errors: list[BaseException] = []

            def work() -> None:
                try:
                    for ledger in range(100_000):
                        for entry in range(12):
                            t.add_message(ledger, entry, 10**6 + entry)  # a seal at every ledger
                        started.set()
                except StoreClosedError:
                    pass
                except BaseException as exc:  # pragma: no cover - reported below
                    errors.append(exc)
                finally:
                    started.set()

            worker = threading.Thread(target=work)
            worker.start()
            started.wait()
            store.delete_tracker("t")
            worker.join()
            assert not errors, errors
            assert store.catalog.buckets("t") == {} and store.trackers() == []
            assert os.listdir(path / "ledgers") == [], "a seal committed after the tracker was deleted"


# -- strict delivery with precision_bits ------------------------------------------------------------

@pytest.mark.parametrize("batch", [False, True])
@pytest.mark.parametrize("strict", [False, True])
def test_strict_mode_with_precision_bits_never_delivers_early(tmp_path, batch, strict):
    cfg = TrackerConfig(tick_time_ms=0, deliver_at_time_strict=strict, precision_bits=4,
                        min_index_count_per_bucket=10)
    clock = FakeClock(0)
    with bucketstore.open(tmp_path / "s") as store:
        t = store.tracker("t", cfg, clock)
        times = [1001, 1008, 1015, 1016]
        if batch:
            t.add_messages([(1, e, ts) for e, ts in enumerate(times)] + [(2, 0, 5000)])
        else:
            for e, ts in enumerate(times):
                t.add_message(1, e, ts)
        first = _first_delivered(t, clock)
        for entry, ts in enumerate(times):
            if strict:
                assert ts <= first[entry] < ts + 16, (entry, ts, first[entry])  # never early
            else:
                assert ts - 16 < first[entry] <= ts, (entry, ts, first[entry])  # never late


@pytest.mark.parametrize("strict", [False, True])
def test_in_memory_timebucket_tracker_strict_mode_never_delivers_early(strict):
    from bucketstore.memory.timebucket_tracker import TimeBucketTracker
    clock = FakeClock(0)
    t = TimeBucketTracker(TrackerConfig(tick_time_ms=0, deliver_at_time_strict=strict, precision_bits=4), clock)
    times = [1001, 1008, 1015, 1016]
    for e, ts in enumerate(times):
        assert t.add_message(1, e, ts)
    first = _first_delivered(t, clock)
    for entry, ts in enumerate(times):
        assert (ts <= first[entry] < ts + 16) if strict else (ts - 16 < first[entry] <= ts), (entry, first[entry])


def _first_delivered(t, clock) -> dict[int, int]:
    """Each entry id's first delivery time, stepping ``clock`` a millisecond at a time over 990-1039."""
    first: dict[int, int] = {}
    for now in range(990, 1040):
        clock.now = now
        for _, entry in t.get_scheduled_messages(100):
            first[entry] = now
    return first
