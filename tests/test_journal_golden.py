"""The golden journal files: the committed bytes are the journal format (formats/journal.md).

Version 1 (no identity) must still be read; version 2 carries the store id and the
tracker name, and today's writer must produce its bytes exactly.
"""

from __future__ import annotations

import os
import sys

import pytest

from bucketstore import JournalError
from bucketstore.engine.journal import parse_file, read_identity

GOLDEN = os.path.join(os.path.dirname(__file__), os.pardir, "formats", "golden")
sys.path.insert(0, GOLDEN)
from make_journal_golden import STORE_ID, TRACKER, journal_bytes  # noqa: E402

EXPECTED = [("c",), ("x", 3, 3), ("a", [5, 5], [1, 2], [1000, 1001]), ("f", 900, 4, 0), ("e",),
            ("a", [6], [0], [2000]), ("x", 5, 1), ("f", 1000, 5, 1)]


def _plain(records):
    return [tuple(v.tolist() if hasattr(v, "tolist") else v for v in rec) for rec in records]


@pytest.mark.parametrize("version", [1, 2])
def test_golden_journal_reads_back_and_is_rewritten_byte_for_byte(version):
    path = os.path.join(GOLDEN, f"journal_v{version}.journal")
    data = open(path, "rb").read()
    assert int.from_bytes(data[8:10], "little") == version
    identity = (STORE_ID, TRACKER)
    parsed = parse_file(data, path, 0, last=True, identity=identity)
    assert parsed.torn_at is None and _plain(parsed.records) == EXPECTED
    assert read_identity(path) == (identity if version == 2 else None)
    assert journal_bytes(version) == data


def test_golden_v2_journal_refuses_another_tracker_or_store():
    path = os.path.join(GOLDEN, "journal_v2.journal")
    data = open(path, "rb").read()
    with pytest.raises(JournalError, match="foreign journal") as info:
        parse_file(data, path, 0, last=True, identity=(STORE_ID, "other"))
    assert info.value.offset == 20
    with pytest.raises(JournalError, match="foreign journal"):
        parse_file(data, path, 0, last=True, identity=("ff" * 16, TRACKER))
