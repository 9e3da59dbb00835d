"""The command line: what dump and verify print, and their exit codes."""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from pyroaring import BitMap

from bucketstore.cli import commands as cli
from bucketstore.format.snapshot import build_bucket, decode_metadata, encode_metadata
from corpus.framing import frame_ledger, split_ledger
import repo_paths

GOLDEN = str(repo_paths.GOLDEN)
DAMAGED = sorted(glob.glob(str(repo_paths.DAMAGED / "*.ledger")))


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_dump_text(capsys) -> None:
    code, out, err = run(capsys, "dump", os.path.join(GOLDEN, "several_ledgers.ledger"), "--indexes", "2")
    assert code == 0 and err == ""
    assert "ledger id   5" in out and "kind         = bucket" in out
    assert "ledgers [100, 104], 150 indexes in 4 segments" in out
    assert re.search(r"^\s+1\s+1700000002903\s+1700000160268\s+40\s+\d+\s", out, re.M)
    assert "100:8 101:8 102:5 103:9 104:10" in out
    assert len(re.findall(r"^ {8}\s*\d+  \d+:\d+$", out, re.M)) == 8  # 2 indexes x 4 segments


def test_dump_of_a_v3_bucket_with_shuffled_bitmaps(capsys) -> None:
    code, out, err = run(capsys, "dump", os.path.join(GOLDEN, "v3_sparse_ledgers.ledger"))
    assert code == 0 and err == ""
    assert "snapshot v3, ledgers [1000, 1119], 1200 indexes in" in out
    assert re.search(r"^ledgers     1000:10 1001:10 .* 1119:10$", out, re.M)


def test_dump_of_a_v4_bucket_says_how_entry_0_stores_each_ledger(capsys) -> None:
    code, out, err = run(capsys, "dump", os.path.join(GOLDEN, "v4_mixed_compression.ledger"))
    assert code == 0 and err == ""
    # Ledger 50 holds a run of 300 ids (a bitmap); ledger 51 three ids, an array: a list.
    assert "snapshot v4" in out and "entry 0     1 ledgers as entry-id lists, 1 as bitmaps" in out
    assert "50:300 51:3" in out
    code, out, _ = run(capsys, "dump", "--json", os.path.join(GOLDEN, "v4_sparse_ledgers.ledger"))
    assert code == 0 and json.loads(out)["bucket"]["listed_ledgers"] == 120


def test_dump_of_a_v5_bucket_says_entry_0_counts_the_listed_ledgers(capsys) -> None:
    code, out, err = run(capsys, "dump", os.path.join(GOLDEN, "v5_sparse_ledgers.ledger"))
    assert code == 0 and err == ""
    assert "snapshot v5" in out and "entry 0     120 ledgers as counts (ids: the segments' rows), 0 as bitmaps" in out
    assert re.search(r"^ledgers     1000:10 1001:10 .* 1119:10$", out, re.M)  # gathered from the segments


def test_dump_of_a_v6_bucket_says_which_segments_are_grouped(capsys) -> None:
    code, out, err = run(capsys, "dump", os.path.join(GOLDEN, "v6_merged_ledgers.ledger"))
    assert code == 0 and err == ""
    assert "snapshot v6" in out
    assert [line.endswith("zstd, grouped") for line in out.splitlines()[-4:]] == [True, False, True, True]
    code, out, _ = run(capsys, "dump", "--json", os.path.join(GOLDEN, "v6_merged_ledgers.ledger"))
    assert [s["layout"] for s in json.loads(out)["segments"]] == ["grouped", "rows", "grouped", "grouped"]


def test_dump_json_is_one_object(capsys) -> None:
    code, out, _ = run(capsys, "dump", "--json", "--indexes", "1", os.path.join(GOLDEN, "wide_entry_ids.ledger"))
    doc = json.loads(out)
    assert code == 0 and doc["error"] is None and doc["ledger_id"] == 6
    first, second = doc["segments"]
    assert first["ledgers"] == [{"ledger_id": 7, "cardinality": 5, "width": 64},
                                {"ledger_id": 8, "cardinality": 5, "width": 32}]
    assert second["indexes"] == [[(1 << 64) - 2, 7, (1 << 64) - 2]]


def test_verify_sound_directory(capsys) -> None:
    docs = [json.load(open(p)) for p in sorted(glob.glob(os.path.join(GOLDEN, "*.json")))
            if os.path.exists(p[:-len(".json")] + ".ledger")]  # a ledger's description (not summary.json)
    segments = sum(len(d["metadata"]["segments"]) for d in docs)
    indexes = sum(d["metadata"]["count"] for d in docs)
    code, out, _ = run(capsys, "verify", GOLDEN)
    assert code == 0
    assert out == f"verified {len(docs)} file(s), {segments} segment(s), {indexes} index(es): ok\n"


@pytest.mark.parametrize("path", DAMAGED, ids=os.path.basename)
def test_damaged_corpus_through_the_cli(capsys, path) -> None:
    code, out, err = run(capsys, "verify", path)
    assert code == 1 and err == ""
    assert re.search(rf"^{re.escape(path)}: offset \d+: ", out, re.M)
    assert "problem(s) in 1 file(s)" in out
    code, out, err = run(capsys, "dump", path)
    assert code == 1 and "Traceback" not in err + out
    assert re.search(r"^DAMAGE      offset \d+: ", out, re.M)


def test_verify_directory_reports_every_damaged_file(capsys) -> None:
    code, out, _ = run(capsys, "verify", str(repo_paths.CORPUS))
    assert code == 1
    assert f"in {len(DAMAGED)} file(s)" in out.splitlines()[-1]


def _rewrite(tmp_path, name: str, edit) -> str:
    lid, props, payloads = split_ledger(os.path.join(GOLDEN, name))
    meta = decode_metadata(payloads[0])
    payloads = edit(meta, payloads)
    path = str(tmp_path / name)
    with open(path, "wb") as f:
        f.write(frame_ledger(lid, props, payloads))
    return path


def test_verify_finds_a_bitmap_that_lies(capsys, tmp_path) -> None:
    def edit(meta, payloads):
        meta.segments[0].bitmaps[3] = BitMap(list(range(1, 21)))  # entry 0 instead of 20: same cardinality
        return [encode_metadata(meta), *payloads[1:]]
    path = _rewrite(tmp_path, "one_segment.ledger", edit)
    assert run(capsys, "dump", path)[0] == 0  # the engine's reader cannot see it...
    code, out, _ = run(capsys, "verify", path)
    assert code == 1 and "segment 1: ledger 3: the bitmap in entry 0 (20 entries) differs" in out


@pytest.mark.parametrize("version", [2, 3])
def test_verify_finds_a_v2_bucket_bitmap_that_lies(capsys, tmp_path, version) -> None:
    def edit(meta, payloads):
        assert meta.version == version
        meta.bitmaps[3] = BitMap(list(range(1, 21)))  # entry 0 instead of 20: same cardinality
        return [encode_metadata(meta), *payloads[1:]]
    path = _rewrite(tmp_path, f"v{version}_one_segment.ledger", edit)
    assert run(capsys, "dump", path)[0] == 0  # the engine's reader cannot see it...
    code, out, _ = run(capsys, "verify", path)
    assert code == 1 and "ledger 3: entry 0's bitmap (20 entries) differs from the 20 entry ids" in out


def test_verify_finds_a_position_in_two_segments(capsys, tmp_path) -> None:
    def edit(meta, payloads):
        # Rebuild as two single-row segments holding the same position at two times.
        u = lambda *v: np.array(v, dtype=np.uint64)  # noqa: E731
        # (Version 1 can express this; version 2's one bitmap per ledger cannot count a position twice.)
        m1, p1 = build_bucket(20, 20, u(1), u(20), u(0), time_step_ms=1, max_indexes_per_segment=1, version=1)
        m2, p2 = build_bucket(20, 20, u(5), u(20), u(0), time_step_ms=1, max_indexes_per_segment=1, version=1)
        m1.segments += m2.segments
        m1.count = 2
        return [encode_metadata(m1), *p1, *p2]
    path = _rewrite(tmp_path, "time_cuts.ledger", edit)
    code, out, _ = run(capsys, "verify", path)
    assert code == 1 and "1 position(s) (ledger, entry) appear in more than one index" in out


@pytest.mark.parametrize("argv", [[], ["dump"], ["dump", "/no/such/file"], ["verify", "/no/such/dir"],
                                  ["dump", GOLDEN], ["dump", "--indexes", "-1", "x"], ["frobnicate"]])
def test_usage_errors_exit_2(capsys, argv) -> None:
    code, out, err = run(capsys, *argv)
    assert code == 2 and "Traceback" not in err
    assert err


def test_unexpected_error_is_one_line(capsys, monkeypatch) -> None:
    def boom(path, on_file=None):
        raise RuntimeError("disk on fire")
    monkeypatch.setattr(cli, "check", boom)
    code, out, err = run(capsys, "verify", GOLDEN)
    assert code == 1 and err == "bucketstore: unexpected error: RuntimeError: disk on fire\n"


def test_python_dash_m_entry_point() -> None:
    env = {**os.environ, "PYTHONPATH": str(repo_paths.ROOT)}
    damaged = str(repo_paths.DAMAGED / "entry0_zlib_bomb.ledger")
    done = subprocess.run([sys.executable, "-m", "bucketstore", "verify", damaged], capture_output=True, text=True,
                          env=env, timeout=60)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert f"{damaged}: offset " in done.stdout
    done = subprocess.run([sys.executable, "-m", "bucketstore", "dump", os.path.join(GOLDEN, "empty.ledger")],
                          capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0 and "0 indexes in 0 segments" in done.stdout
