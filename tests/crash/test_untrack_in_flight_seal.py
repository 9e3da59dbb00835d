"""An untrack made while a seal of its ledger is in flight survives a journal checkpoint.

The real worker runs two seals' works side by side: the second seal's file may already hold a
position when an expired re-add untracks it and the first seal's install checkpoints the
journal. That checkpoint replaces the file holding the untrack record; if it carried untracks
only for ledgers of installed buckets, a crash after the second seal commits its key (before
its own checkpoint) would bring the position back from the new bucket's bitmap, and deliver
again what the embedder dispatched when the re-add returned False.
"""

from __future__ import annotations

import pytest

import bucketstore
from bucketstore import TrackerConfig
from bucketstore.engine.maintenance.seal_pipeline import SealJob
from bucketstore.engine.store.store import Store
from bucketstore.testing import SteppedWorker, abandon_store
from bucketstore.testing.faults import SimulatedCrash

from helpers import FakeClock


@pytest.mark.parametrize("committed", [True, False])
@pytest.mark.parametrize("again_at", [None, 8_000])
def test_an_untrack_in_a_ledger_being_sealed_survives_another_seals_checkpoint(tmp_path, monkeypatch, again_at,
                                                                              committed):
    """``again_at``: the position is then added again at that time (a later one than its old
    row's): after the crash it is due then, not at its old time. ``committed``: the crash
    comes after the second seal's catalog commit (else before it: its file is an orphan, and
    the carried untrack finds nothing to cancel)."""
    worker = SteppedWorker()  # two jobs' works may run before the first installs
    clock = FakeClock(1_000)
    cfg = TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=4, max_indexes_per_segment=3)
    store = Store(tmp_path, "journal", background=True, maintenance=worker)
    t = store.tracker("sub", cfg, clock)
    added = {}
    for ledger in (1, 2):
        for e in range(6):
            added[(ledger, e)] = 5_000 + 100 * ledger + e
            assert t.add_message(ledger, e, added[(ledger, e)])
    # (ledger 2's first add froze [1, 1]; ledger 3's freezes [2, 2])
    added[(3, 0)] = 9_000
    assert t.add_message(3, 0, 9_000)
    assert worker.pending_kinds() == ["create", "create"]
    worker.work()           # [1, 1]'s file
    worker.work(1)          # [2, 2]'s file, holding (2, 3)
    # An expired re-add: the embedder dispatches (2, 3) itself now.
    assert t.add_message(2, 3, 900) is False
    del added[(2, 3)]
    assert not t.contains_message(2, 3)
    if again_at is not None:
        assert t.add_message(2, 3, again_at)
        added[(2, 3)] = again_at
    assert worker.install()  # [1, 1] installs and checkpoints the journal
    assert [(b.start_ledger, b.end_ledger) for b in t.buckets()] == [(1, 1)]

    def crash(*_: object) -> None:
        raise SimulatedCrash("[2, 2]'s install")

    if committed:
        monkeypatch.setattr(t, "checkpoint_after_seal", crash)
    else:
        monkeypatch.setattr(SealJob, "_before_lock", crash)
    with pytest.raises(SimulatedCrash):
        worker.install()  # [2, 2] commits its key (or not), then the process dies
    assert len(store.catalog.buckets("sub")) == (2 if committed else 1)
    monkeypatch.undo()  # the next process runs unpatched code
    abandon_store(store)

    with bucketstore.open(tmp_path, "journal") as again:
        t = again.tracker("sub", cfg, clock)
        assert t.contains_message(2, 3) == (again_at is not None), "an untracked position came back"
        assert t.number_of_delayed_messages == len(added)
        for now in sorted(set(added.values())):  # each index is delivered at its time, once
            clock.now = now
            assert sorted(t.get_scheduled_messages(100)) == sorted(p for p, at in added.items() if at == now)
        t._check()
