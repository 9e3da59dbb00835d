"""The catalog's LMDB map grows under concurrent use without failing anyone's transaction.

LMDB remaps the file when the map grows and py-lmdb invalidates every transaction of the
process that is open meanwhile; without the map gate, readers on other threads failed with
"Attempt to operate on closed/deleted/dropped object" or "mdb_txn_begin: Invalid argument"
while one thread's commits grew the map.
"""

from __future__ import annotations

import threading
import time

import pytest

from bucketstore.engine.catalog import catalog as catalog_module
from bucketstore.engine.catalog.catalog import Catalog
from bucketstore.engine.catalog.map_gate import MapGate


def test_readers_on_other_threads_survive_map_growth(tmp_path, monkeypatch):
    monkeypatch.setattr(catalog_module, "_INITIAL_MAP_SIZE", 64 << 10)  # grows within a few commits
    catalog = Catalog(tmp_path / "catalog")
    initial = catalog._env.info()["map_size"]
    stop = threading.Event()
    errors: list[BaseException] = []
    reads = [0, 0]

    def reader(slot: int) -> None:
        while not stop.is_set():
            try:
                keys, summaries = catalog.keys_and_summaries("t")
                assert len(summaries) == len(keys)  # one transaction: keys and summaries agree
                catalog.tracker_names()
                reads[slot] += 1
            except BaseException as exc:  # noqa: BLE001 - any failure is the finding
                errors.append(exc)
                return
            time.sleep(0.0002)  # leave the writer some of the GIL

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    try:
        for i in range(600):
            key = f"#pulsar.internal.delayed.bucket_{i}_{i}"
            catalog.commit("t", put={key: i}, summaries={key: bytes([i % 251]) * 2048},
                           state={"n": i}, next_ledger_id=i + 1)
            if errors:
                break
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors[0]
    assert catalog._env.info()["map_size"] > 4 * initial  # the map really grew, several times
    assert min(reads) > 0  # both readers ran beside the growth
    keys, summaries = catalog.keys_and_summaries("t")
    assert len(keys) == len(summaries) == 600
    catalog.close()


def test_gate_exclusive_waits_for_shared_holders_and_stops_new_ones():
    gate = MapGate()
    order: list[str] = []
    inside = threading.Event()
    release = threading.Event()

    def holder() -> None:
        with gate.shared():
            inside.set()
            release.wait(10)
            with gate.shared():  # re-entry while an exclusive holder waits must not block
                order.append("reentered")
        order.append("shared released")

    def resizer() -> None:
        with gate.exclusive():
            order.append("exclusive")

    h = threading.Thread(target=holder)
    h.start()
    assert inside.wait(10)
    r = threading.Thread(target=resizer)
    r.start()
    while not gate._waiting:  # the resizer is queued
        time.sleep(0.001)
    late: list[str] = []
    newcomer = threading.Thread(target=lambda: (gate.shared().__enter__(), late.append("in")))
    newcomer.start()
    time.sleep(0.05)
    assert late == []  # a new shared entry waits behind the queued exclusive one
    release.set()
    for t in (h, r, newcomer):
        t.join(10)
    assert order == ["reentered", "shared released", "exclusive"]
    assert late == ["in"]


def test_gate_exclusive_inside_shared_is_refused():
    gate = MapGate()
    with gate.shared():
        with pytest.raises(RuntimeError):
            with gate.exclusive():
                pass
    with gate.exclusive():  # and free again afterwards
        pass
