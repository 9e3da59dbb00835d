"""The golden journal files: the committed bytes are the journal format (formats/journal.md).

Version 1 (no identity) must still be read; version 2 carries the store id and the
tracker name, and today's writer must produce its bytes exactly.
"""

from __future__ import annotations

import os
import sys

import pytest

from bucketstore import JournalError
from bucketstore.engine.durability.journal import read_identity
from bucketstore.format.journal_codec import parse_file
from repo_paths import DAMAGED, GOLDEN

sys.path.insert(0, str(GOLDEN))
from make_journal_golden import STORE_ID, TOPIC, TRACKER, journal_bytes, topic_journal_bytes  # noqa: E402

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


TOPIC_EXPECTED = [("c",), ("e",), ("t", 0, [7, 7], [0, 1], [1500, 1600], [1001, 1001]),
                  ("t", 2, [8], [0], [900], [1201])]


def test_golden_topic_journal_reads_back_and_is_rewritten_byte_for_byte():
    path = os.path.join(GOLDEN, "topic_journal.journal")
    data = open(path, "rb").read()
    parsed = parse_file(data, path, 0, last=True, identity=(STORE_ID, TOPIC), topic=True)
    assert parsed.torn_at is None and _plain(parsed.records) == TOPIC_EXPECTED
    assert read_identity(path) == (STORE_ID, TOPIC)
    assert topic_journal_bytes() == data


def test_a_tracker_refuses_a_topic_record_and_a_topic_a_tracker_record():
    """Each kind of journal holds its own records: a file of the other kind is damage, never
    replayed as something it is not."""
    topic = os.path.join(GOLDEN, "topic_journal.journal")
    with pytest.raises(JournalError, match="malformed journal record of kind 't'"):
        parse_file(open(topic, "rb").read(), topic, 0, last=True)
    tracker = os.path.join(GOLDEN, "journal_v2.journal")
    with pytest.raises(JournalError, match="malformed topic journal record of kind 'x'"):
        parse_file(open(tracker, "rb").read(), tracker, 0, last=True, topic=True)


# -- the damaged journal corpus (tests/corpus/damaged/journal_*.journal) -----------------------------

from corpus.make_damaged import JOURNAL_CASES  # noqa: E402


@pytest.mark.parametrize("name", sorted(JOURNAL_CASES))
def test_damaged_journal_corpus_is_refused_at_the_offset_the_spec_names(name):
    make, offset = JOURNAL_CASES[name]
    path = os.path.join(DAMAGED, name + ".journal")
    data = open(path, "rb").read()
    assert data == make()  # the committed file is what make_damaged.py writes
    # As the newest file (where a torn tail is allowed) and as an older one: neither is a torn tail.
    for last in (True, False):
        with pytest.raises(JournalError) as info:
            parse_file(data, path, 0, last=last, identity=(STORE_ID, TRACKER))
        assert info.value.offset == offset, (last, info.value)


def test_an_empty_group_at_the_end_of_the_newest_file_is_a_torn_tail():
    """body_len 0 is never written; nothing after it: the torn-tail rule applies, as for a CRC failure."""
    data = open(os.path.join(GOLDEN, "journal_v2.journal"), "rb").read()
    tail = data + bytes(8)[:4] + b"\x01\x00\x00\x00" + bytes(16)  # length 0, CRC 1, then zeros
    parsed = parse_file(tail, "j", 0, last=True)
    assert parsed.torn_at == len(data) and _plain(parsed.records) == EXPECTED
    with pytest.raises(JournalError, match="group of 0 bytes"):
        parse_file(tail, "j", 0, last=False)
