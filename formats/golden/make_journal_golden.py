"""Write the golden journal files (``journal_v1.journal``, ``journal_v2.journal``, and a topic's,
``topic_journal.journal``).

Run from the repository root::

    PYTHONPATH=. python formats/golden/make_journal_golden.py

Both hold the same records, written by the library's own journal writer: a
checkpoint (an untrack, two indexes, a frontier), then two groups. Version 1
is what a journal without identity writes (every journal before format
version 2); version 2 names store ``00112233445566778899aabbccddeeff`` and
tracker ``sub-é``. ``tests/format/test_journal_golden.py`` reads both back, checks
the records and the identity, and writes them again byte for byte.

The topic's journal (``formats/journal.md``, "A topic's journal") names topic ``orders`` of the
same store: an empty checkpoint, then two groups of ``t`` records (adds 0 and 1 of one call,
add 2 of a later call, each with its call's cutoff plus one).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
STORE_ID = "00112233445566778899aabbccddeeff"
TRACKER = "sub-\u00e9"


def _written(write) -> bytes:
    """The bytes of the one journal file ``write(Journal, directory)`` leaves in a fresh directory."""
    from bucketstore.engine.durability.journal import Journal

    directory = tempfile.mkdtemp()
    try:
        write(Journal, directory)
        (name,) = os.listdir(directory)
        with open(os.path.join(directory, name), "rb") as f:
            return f.read()
    finally:
        shutil.rmtree(directory)


def journal_bytes(version: int) -> bytes:
    """The golden content of a version-``version`` journal file, freshly written."""
    def write(Journal, directory: str) -> None:
        identity = {"tracker": TRACKER, "store_id": STORE_ID} if version == 2 else {}
        j = Journal(directory, **identity)
        u64 = np.uint64
        j.checkpoint(np.array([5, 5], u64), np.array([1, 2], u64), np.array([1000, 1001], u64), (900, 4, 0),
                     [(3, 3)])
        j.add_one(6, 0, 2000)
        j.commit()
        j.untrack(5, 1)
        j.frontier((1000, 5, 1))
        j.commit()
        j.close()

    return _written(write)


TOPIC = "orders"


def topic_journal_bytes() -> bytes:
    """The golden content of a topic's journal file, freshly written."""
    def write(Journal, directory: str) -> None:
        j = Journal(directory, tracker=TOPIC, store_id=STORE_ID, topic=True)
        u64 = np.uint64
        empty = np.zeros(0, u64)
        j.checkpoint(empty, empty, empty, None)
        j.add_topic_rows(0, np.array([7, 7], u64), np.array([0, 1], u64), np.array([1500, 1600], u64),
                         np.array([1001, 1001], u64))
        j.commit()
        j.add_topic_rows(2, np.array([8], u64), np.array([0], u64), np.array([900], u64), np.array([1201], u64))
        j.commit()
        j.close()

    return _written(write)


def main() -> None:
    for version in (1, 2):
        with open(os.path.join(HERE, f"journal_v{version}.journal"), "wb") as f:
            f.write(journal_bytes(version))
    with open(os.path.join(HERE, "topic_journal.journal"), "wb") as f:
        f.write(topic_journal_bytes())


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(HERE, os.pardir, os.pardir))
    main()
