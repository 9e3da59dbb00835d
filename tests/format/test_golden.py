"""The golden files: the committed bytes are the format.

Every ``formats/golden/*.ledger`` must read back as exactly its ``.json``, and
encoding the ``.json`` with today's code must give the committed bytes. A
failure of the second kind means the writer's output changed: if a v1 reader
would misread the new bytes, the format version must go up (see
``formats/bucket_snapshot.md``); if not, regenerate with
``formats/golden/make_golden.py`` and say why in the commit.
"""

from __future__ import annotations

import glob
import json
import os

import numpy as np
import pytest
from pyroaring import BitMap, BitMap64

from bucketstore.format.segment_codec import FLAG_GROUPED, GROUPED_VERSION, encode_segment
from bucketstore.format.snapshot import BucketFile, BucketMetadata, SegmentMetadata, write_bucket
from bucketstore import check_file
from repo_paths import GOLDEN

FILES = sorted(glob.glob(os.path.join(GOLDEN, "*.ledger")))
AUTOMATIC_PROPERTIES = {"kind", "bucket_key", "start_ledger", "end_ledger"}


def _expected(path: str) -> dict:
    with open(path[:-len(".ledger")] + ".json", encoding="utf-8") as f:
        return json.load(f)


def _read_back(path: str) -> dict:
    """The file's content in the JSON's shape, read with the public reader."""
    with BucketFile(path) as bucket:
        meta = bucket.metadata
        segments = []
        for number, seg_meta in enumerate(meta.segments, start=1):
            seg = bucket.read_segment(number)
            flags = bucket.ledger.read_entry(number)[0]
            grouped = meta.version >= GROUPED_VERSION and bool(flags & FLAG_GROUPED)
            flags &= ~FLAG_GROUPED
            assert flags in (0, _CODEC_FLAG[meta.version])  # v1 writes zlib, v2 to v6 zstd
            segment = {
                "min_timestamp": seg_meta.min_timestamp,
                "max_timestamp": seg_meta.max_timestamp,
                "count": seg_meta.count,
                "compressed": flags != 0,
            }
            if meta.version >= GROUPED_VERSION:
                segment["grouped"] = grouped
            if meta.version == 1:
                segment["bitmaps"] = _bitmap_docs(seg_meta.bitmaps)
            segment["indexes"] = [list(r) for r in zip(seg.timestamps.tolist(), seg.ledger_ids.tolist(),
                                                       seg.entry_ids.tolist())]
            segments.append(segment)
        flags = bucket.ledger.read_entry(0)[0]
        assert flags in (0, _CODEC_FLAG[meta.version])
        metadata = {"compressed": flags != 0, "snapshot_version": meta.version, "start_ledger": meta.start_ledger,
                    "end_ledger": meta.end_ledger, "count": meta.count}
        if meta.version >= 2:
            metadata["bitmaps"] = _bitmap_docs(meta.bitmaps)
        metadata["segments"] = segments
        return {
            "header": {"ledger_id": bucket.ledger_id, "format_version": bucket.ledger.version, "flags": 0},
            "properties": bucket.ledger.properties,
            "metadata": metadata,
        }


_CODEC_FLAG = {1: 0x01, 2: 0x02, 3: 0x02, 4: 0x02, 5: 0x02, 6: 0x02}


def _bitmap_docs(bitmaps: dict) -> list[dict]:
    return [{"ledger_id": ledger, "width": 64 if isinstance(bm, BitMap64) else 32, "entries": list(bm)}
            for ledger, bm in sorted(bitmaps.items())]


def _bitmap(spec: dict) -> BitMap | BitMap64:
    bm = (BitMap64 if spec["width"] == 64 else BitMap)(spec["entries"])
    bm.run_optimize()  # the writer's rule: containers are run-optimised before serialising
    return bm


def _encode(doc: dict, directory: str) -> bytes:
    """Encode a golden JSON document with the library's encoders; return the file's bytes."""
    m = doc["metadata"]
    version = m["snapshot_version"]
    metas, payloads = [], []
    for seg in m["segments"]:
        cols = np.array(seg["indexes"], dtype=np.uint64).reshape(-1, 3).T
        payloads.append(encode_segment(cols[0], cols[1], cols[2], compress=seg["compressed"],
                                       codec="zlib" if version == 1 else "zstd", grouped=version >= GROUPED_VERSION))
        metas.append(SegmentMetadata(seg["min_timestamp"], seg["max_timestamp"], seg["count"],
                                     {b["ledger_id"]: _bitmap(b) for b in seg.get("bitmaps", [])}))
    meta = BucketMetadata(m["start_ledger"], m["end_ledger"], m["count"], metas, version,
                          {b["ledger_id"]: _bitmap(b) for b in m.get("bitmaps", [])})
    extra = {k: v for k, v in doc["properties"].items() if k not in AUTOMATIC_PROPERTIES}
    path = write_bucket(directory, doc["header"]["ledger_id"], meta, payloads, extra, compress=m["compressed"])
    with open(path, "rb") as f:
        return f.read()


@pytest.mark.parametrize("version", [1, 2, 3, 4, 5, 6])
def test_golden_set_covers_the_required_shapes(version) -> None:
    docs = [d for d in map(_expected, FILES) if d["metadata"]["snapshot_version"] == version]
    segments = [s for d in docs for s in d["metadata"]["segments"]]
    bitmap_sets = [s["bitmaps"] for s in segments] if version == 1 else [d["metadata"]["bitmaps"] for d in docs]
    assert any(d["metadata"]["count"] == 0 for d in docs)
    assert any(len(d["metadata"]["segments"]) == 1 for d in docs)
    cuts = [(d["segmenting"]["max_indexes_per_segment"], s["count"])
            for d in docs for s in d["metadata"]["segments"][:-1]]  # every segment but a bucket's last was cut
    assert any(count != cap for cap, count in cuts), "no segment cut by the time step"
    assert any(count == cap for cap, count in cuts), "no segment cut by the count"
    assert any(len(bitmaps) > 2 for bitmaps in bitmap_sets)
    assert any(b["width"] == 64 for bitmaps in bitmap_sets for b in bitmaps)
    assert any(s["compressed"] for s in segments) and not all(s["compressed"] for s in segments)
    assert any(d["metadata"]["compressed"] for d in docs) and not all(d["metadata"]["compressed"] for d in docs)
    if version >= GROUPED_VERSION:  # grouped and not, compressed and not
        assert {(s["grouped"], s["compressed"]) for s in segments} == {(g, c) for g in (False, True) for c in (False, True)}


@pytest.mark.parametrize("path", FILES, ids=os.path.basename)
def test_golden_file_reads_as_its_json(path: str) -> None:
    expected = _expected(path)
    got = _read_back(path)
    for key in ("header", "properties", "metadata"):
        assert got[key] == expected[key], key
    assert check_file(path).findings == ()


@pytest.mark.parametrize("path", FILES, ids=os.path.basename)
def test_golden_json_encodes_to_the_same_bytes(path: str, tmp_path) -> None:
    with open(path, "rb") as f:
        committed = f.read()
    assert _encode(_expected(path), str(tmp_path)) == committed
