"""``bucketstore dump FILE.run``: a topic's sealed run file (formats/topic_runs.md) shown as a
ledger file is: header, its ledgers' bitmaps, segments (``--indexes N`` rows), ``--json``;
damage is exit 1 and one line naming the file and the offset."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

import bucketstore
from bucketstore.cli import commands as cli
from bucketstore.format.topic_run import HEADER, TRAILER, decode_directory, decode_segment, decode_trailer
from helpers import FakeClock
from repo_paths import GOLDEN

GOLDEN_RUN = GOLDEN / "topic_run.run"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def all_rows(path) -> tuple[list, np.ndarray]:
    """The file's segments and rows, decoded by the format module directly."""
    raw = open(path, "rb").read()
    trailer = decode_trailer(raw[-TRAILER.size:], len(raw))
    d = decode_directory(raw[:HEADER.size], raw[trailer[0]:trailer[0] + trailer[1]], trailer)
    rows = [decode_segment(raw[s.offset:s.offset + s.length], s) for s in d.segments]
    return list(d.segments), np.concatenate(rows)


def test_dump_of_the_golden_run_shows_header_ledgers_and_segments(capsys, tmp_path) -> None:
    want = json.loads((GOLDEN / "topic_run.json").read_text())
    code, out, err = run(capsys, "dump", "--json", "--indexes", "3", str(GOLDEN_RUN))
    assert code == 0 and err == ""
    doc = json.loads(out)
    assert (doc["kind"], doc["error"], doc["topic_id"], doc["run_id"], doc["rows"], doc["size"]) == (
        "topic_run", None, want["topic_id"], want["run_id"], want["rows"], os.path.getsize(GOLDEN_RUN))
    assert [(s["rows"], s["min_deliver_at"], s["max_deliver_at"]) for s in doc["segments"]] == [
        (s["rows"], s["first_ts"], s["last_ts"]) for s in want["segments"]]
    assert doc["segments"][0]["indexes"] == want["first_rows"]
    assert (doc["min_deliver_at"], doc["max_deliver_at"]) == (want["first_rows"][0][0], want["last_rows"][-1][0])
    segments, rows = all_rows(GOLDEN_RUN)
    assert [(s["offset"], s["size"]) for s in doc["segments"]] == [(s.offset, s.length) for s in segments]
    assert [(s["min_seq"], s["max_seq"]) for s in doc["segments"]] == [
        (int(r[:, 3].min()), int(r[:, 3].max())) for r in np.split(rows, [segments[0].rows])]
    ledgers = {}
    for ledger, entry in rows[:, 1:3].tolist():
        ledgers.setdefault(ledger, set()).add(entry)
    assert [(lg["ledger_id"], lg["cardinality"], lg["min_entry"], lg["max_entry"]) for lg in doc["ledgers"]] == [
        (lg, len(es), min(es), max(es)) for lg, es in sorted(ledgers.items())]
    assert any(lg["width"] == 64 for lg in doc["ledgers"])  # an entry id past 32 bits

    code, text, _ = run(capsys, "dump", "--indexes", "2", str(GOLDEN_RUN))
    assert code == 0
    lines = text.splitlines()
    assert f"topic id    {want['topic_id']}" in lines and f"run id      {want['run_id']}" in lines
    assert f"rows        {want['rows']}" in lines and "(64-bit)" in text
    first = want["first_rows"][0]
    assert f"{first[0]:>28}  {first[1]}:{first[2]}  seq {first[3]}" in lines
    assert sum(line.startswith(f"{n:>7} {segments[n].offset:>10} ") for n in (0, 1) for line in lines) == 2
    assert "DAMAGE" not in text


def test_dump_of_a_run_a_topic_sealed(capsys, tmp_path) -> None:
    with bucketstore.open(tmp_path / "s") as store:
        topic = store.topic("t", config=bucketstore.TrackerConfig(tick_time_ms=0, min_index_count_per_bucket=50),
                            clock=FakeClock(1_000))
        topic.subscription("a")
        topic.add_messages([(i // 100, i % 100, 2_000 + i) for i in range(120)])
    runs = os.path.join(tmp_path, "s", "topics", "runs")
    names = sorted(n for n in os.listdir(runs) if n.endswith(".run"))
    assert names
    code, out, _ = run(capsys, "dump", "--json", os.path.join(runs, names[0]))
    doc = json.loads(out)
    assert code == 0 and doc["error"] is None and names[0] == f"{doc['topic_id']:010d}-{doc['run_id']:020d}.run"
    assert sum(s["rows"] for s in doc["segments"]) == doc["rows"] == sum(lg["cardinality"] for lg in doc["ledgers"])


def _segment1(path) -> int:
    segments, _ = all_rows(path)
    return segments[1].offset


@pytest.mark.parametrize("damage", ["segment", "bitmaps", "truncated", "empty", "magic"])
def test_a_damaged_run_exits_1_with_one_line_naming_the_file_and_offset(capsys, tmp_path, damage) -> None:
    path = str(tmp_path / os.path.basename(GOLDEN_RUN))
    shutil.copyfile(GOLDEN_RUN, path)
    raw = bytearray(open(path, "rb").read())
    code, out, _ = run(capsys, "dump", "--json", path)
    bitmaps = json.loads(out)["bitmaps"]["offset"]
    if damage == "segment":
        at = _segment1(path)
        raw[at + 10] ^= 0xFF
    elif damage == "bitmaps":
        at = bitmaps
        raw[at + 6] ^= 0xFF
    elif damage == "truncated":
        del raw[-5:]
        at = len(raw) - 8  # where the end magic should be in the shorter file
    elif damage == "empty":
        raw, at = bytearray(), 0
    else:
        raw[:4] = b"XXXX"
        at = 0
    open(path, "wb").write(bytes(raw))
    code, out, err = run(capsys, "dump", path)
    assert code == 1 and err == ""
    damage_lines = [line for line in out.splitlines() if "DAMAGE" in line]
    assert len(damage_lines) == 1 and damage_lines[0].startswith(f"DAMAGE      {path}: at offset {at}: ")
    assert "Traceback" not in out
    if damage == "segment":  # what was read before the damage is shown: segment 0, segment 1's entry
        assert out.splitlines()[-3].startswith(f"{0:>7} {HEADER.size:>10} ")
        assert out.splitlines()[-2].startswith(f"{1:>7} {at:>10} ")
    code, out, _ = run(capsys, "dump", "--json", path)
    doc = json.loads(out)
    assert code == 1 and doc["error"]["offset"] == at


def test_a_file_named_run_with_garbage_is_damage_and_no_file_is_a_usage_error(capsys, tmp_path) -> None:
    named = tmp_path / "x.run"
    named.write_bytes(b"hello, world, this is not a run file at all\n")
    code, out, _ = run(capsys, "dump", str(named))
    assert code == 1 and f"DAMAGE      {named}: at offset 0: " in out
    code, _, err = run(capsys, "dump", str(tmp_path / "missing.run"))
    assert code == 2 and "no such file" in err
