"""The damaged-summary corpus (tests/corpus/damaged/*.summary): every field of a catalog summary
changed in turn is either refused as it is decoded or disagrees with the bucket it describes.

The cases are the golden summary (formats/golden/summary_v2.bin, of the bucket
``make_summary_golden.golden_bucket()`` stored as ledger 5 of 777 bytes) with one field
wrong but the record well-formed where it can be. What a reader has to check, and where
a disagreement is found (``formats/catalog.md``), is what this pins; that the engine
deletes nothing on such a summary's word is ``tests/engine/catalog/test_deletion_evidence.py``.
"""

from __future__ import annotations

import os
import sys

import pytest

from bucketstore import CatalogError
from bucketstore.engine.buckets.bucket_prefix import take_head
from bucketstore.engine.buckets.sealed_bucket import SealedBucket
from bucketstore.format.bucket_summary import decode_summary, prefix_mismatch, summary_mismatch
from corpus.summary_damage import CAUGHT_AT, SUMMARY_CASES, fields, pack
from repo_paths import DAMAGED, GOLDEN

sys.path.insert(0, str(GOLDEN))
from make_summary_golden import golden_bucket  # noqa: E402

LEDGER_ID, SIZE, KEY = 5, 777, "#pulsar.internal.delayed.bucket_3_4"


def _golden() -> bytes:
    with open(os.path.join(GOLDEN, "summary_v2.bin"), "rb") as f:
        return f.read()


def _caught(raw: bytes) -> str | None:
    """Where a reader following catalog.md finds what is wrong with ``raw``, or None."""
    meta, rows = golden_bucket()
    try:
        summary = decode_summary(raw, path="catalog", key=KEY)
        if summary.ledger_id != LEDGER_ID:  # the key's ledger (recovery's check)
            raise CatalogError(f"summary describes ledger {summary.ledger_id}", path="catalog", key=KEY)
        summary.table()
        take_head(SealedBucket.unopened("unused", LEDGER_ID, 3, 4, summary))  # the prefix's positions
    except CatalogError as exc:
        assert exc.key == KEY and exc.path == "catalog"
        return "refused"
    if summary_mismatch(summary, meta, SIZE) is not None:
        return "entry 0"
    if prefix_mismatch(summary, *rows) is not None:
        return "segment 1"
    return None


def test_the_layout_read_from_the_spec_round_trips_the_golden_summary() -> None:
    raw = _golden()
    assert pack(fields(raw)) == raw
    assert _caught(raw) is None  # sound: the cases below are wrong only by their change


def test_every_field_has_a_case() -> None:
    assert set(CAUGHT_AT) == set(SUMMARY_CASES)


@pytest.mark.parametrize("name", sorted(SUMMARY_CASES))
def test_a_damaged_summary_is_refused_or_disagrees_with_its_bucket(name: str) -> None:
    with open(os.path.join(DAMAGED, name + ".summary"), "rb") as f:
        data = f.read()
    assert data == SUMMARY_CASES[name](_golden())  # the committed file is what make_damaged.py writes
    assert data != _golden()
    assert _caught(data) == CAUGHT_AT[name]
