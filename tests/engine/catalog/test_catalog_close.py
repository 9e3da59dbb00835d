"""Closing the catalog while another thread is inside one of its write transactions.

py-lmdb (from 2.2.1) closes an environment from another thread by marking the live
write transaction finished and waiting for the thread that began it to end it. That
thread's ``with`` block then neither commits nor raises, and a transaction whose
operation raised ends only when its object is freed: the traceback of a kept
exception (a failed maintenance job keeps its error) held it, and the close hung
forever. :meth:`Catalog.close` therefore waits for a write transaction in flight.

Each case runs in a child process with a timeout: without that wait it hangs inside
LMDB's close, where no Python timeout can reach it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

_PRELUDE = textwrap.dedent("""
    import sys, threading, time
    from collections.abc import Mapping
    from bucketstore.engine.catalog.catalog import Catalog
    from bucketstore.errors import CatalogError

    path = sys.argv[1]
    catalog = Catalog(path)
    inside, proceed = threading.Event(), threading.Event()
    kept = []

    def close_soon():
        closer = threading.Thread(target=catalog.close)
        closer.start()
        time.sleep(0.3)  # long enough for a close that does not wait to reach LMDB's
        proceed.set()
        closer.join()
""")

# A put whose second key is written after the close began: the put then fails on a
# transaction the close has marked finished, and the caller keeps the error (with its
# traceback, as a failed maintenance job does).
_KEPT_ERROR = _PRELUDE + textwrap.dedent("""
    class SlowPut(Mapping):
        def __getitem__(self, key): return {"a": 1, "b": 2}[key]
        def __len__(self): return 2
        def __iter__(self): return iter("ab")
        def items(self):
            yield "a", 1
            inside.set(); proceed.wait()
            yield "b", 2

    def write():
        try:
            catalog.commit("t", put=SlowPut(), next_ledger_id=3)
        except CatalogError as exc:
            kept.append(exc)

    writer = threading.Thread(target=write); writer.start(); inside.wait()
    close_soon(); writer.join()
    with Catalog(path) as again:
        print(sorted(again.buckets("t").items()), len(kept))
""")

# The close begins after the last put, before the commit: the commit must not vanish.
_SILENT = _PRELUDE + textwrap.dedent("""
    def hold():
        inside.set(); proceed.wait()
    catalog.before_commit = hold

    def write():
        try:
            catalog.commit("t", put={"a": 1}, next_ledger_id=2)
            kept.append("returned")
        except CatalogError as exc:
            kept.append(type(exc).__name__)

    writer = threading.Thread(target=write); writer.start(); inside.wait()
    close_soon(); writer.join()
    try:
        catalog.commit("t", put={"b": 2})
    except CatalogError as exc:
        kept.append("closed: " + str(exc).split(": ", 1)[1])
    except Exception as exc:  # anything untyped is a failure too
        kept.append(type(exc).__name__)
    with Catalog(path) as again:
        print(sorted(again.buckets("t").items()), kept)
""")


def _run(script: str, tmp_path) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    try:
        done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "catalog")], capture_output=True,
                              text=True, timeout=30, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail("Catalog.close() beside a write transaction in flight hung")
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_close_waits_for_a_write_transaction_whose_caller_keeps_its_error(tmp_path):
    # The transaction in flight finishes (committed) before the environment closes.
    assert _run(_KEPT_ERROR, tmp_path) == "[('a', 1), ('b', 2)] 0"


def test_close_beside_a_commit_loses_no_commit_that_returned(tmp_path):
    # The commit in flight is durable when it returns; a later one is a typed refusal.
    assert _run(_SILENT, tmp_path) == "[('a', 1)] ['returned', 'closed: the catalog is closed']"
