"""``bucketstore.check`` / ``check_file``: checking as a library call, the report ``verify`` prints.

The command line's own tests (test_cli*.py, test_verify_store.py, test_integrity.py) hold its
output; these hold the report's fields, its errors for wrong paths, and that the report and the
command agree on the same store.
"""

from __future__ import annotations

import glob
import os

import pytest

import bucketstore
from bucketstore.cli import commands as cli
from bucketstore.format.ledger_file import LedgerReader
from repo_paths import DAMAGED


def _sealed_store(path: str) -> str:
    """A sealed-mode store with two sealed buckets of 100 indexes (ledger 3 stays mutable)."""
    config = bucketstore.TrackerConfig(min_index_count_per_bucket=100)
    with bucketstore.open(path, durability="sealed", background=False) as store:
        tracker = store.tracker("t", config, clock=lambda: 0)
        for ledger in (1, 2, 3):
            tracker.add_messages(([ledger] * 100, list(range(100)), [60_000 + e for e in range(100)]))
    return path


def _journal_with_torn_tail(path: str) -> str:
    with bucketstore.open(path, durability="journal") as store:
        store.tracker("j", clock=lambda: 0).add_message(1, 0, 10_000)
    (journal,) = glob.glob(os.path.join(path, "journal", "*", "*.journal"))
    with open(journal, "ab") as f:
        f.write(b"\x07" * 5)  # half a group header: what a crash mid-append leaves
    return journal


def test_a_sound_store_reports_what_it_read(tmp_path) -> None:
    report = bucketstore.check(_sealed_store(str(tmp_path / "s")))
    assert isinstance(report, bucketstore.CheckReport)
    assert report.ok and report.findings == () and report.damage == [] and report.warnings == []
    assert (report.files, report.segments, report.indexes, report.in_flight) == (2, 2, 200, 0)


def test_damage_is_a_typed_finding_with_file_and_offset(tmp_path) -> None:
    store = _sealed_store(str(tmp_path / "s"))
    victim = sorted(glob.glob(os.path.join(store, "ledgers", "*.ledger")))[0]
    with open(victim, "r+b") as f:
        f.seek(os.path.getsize(victim) - 60)  # inside entry 1, the first segment
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x40]))
    report = bucketstore.check(store)
    assert not report.ok
    (finding,) = report.findings
    assert isinstance(finding, bucketstore.Finding) and finding.kind == "damage" and report.damage == [finding]
    with LedgerReader(victim) as reader:
        entry_1 = reader.entry_offset(1)
    assert finding.path == victim and finding.offset == entry_1 and "entry 1 CRC mismatch" in finding.message
    # The per-file call finds the same, and counts the file alone.
    alone = bucketstore.check_file(victim)
    assert alone.findings == (finding,) and alone.files == 1


def test_a_torn_journal_tail_is_a_warning_not_damage(tmp_path) -> None:
    store = str(tmp_path / "j")
    journal = _journal_with_torn_tail(store)
    report = bucketstore.check(store)
    (finding,) = report.findings
    assert report.ok and finding.kind == "warning" and report.warnings == [finding]
    assert finding.path == journal and finding.offset == os.path.getsize(journal) - 5


def test_files_and_directories_of_ledger_files(tmp_path) -> None:
    store = _sealed_store(str(tmp_path / "s"))
    ledgers = os.path.join(store, "ledgers")
    whole = bucketstore.check(ledgers)  # a directory of ledger files, each checked alone
    assert whole.ok and (whole.files, whole.indexes) == (2, 200)
    damaged = bucketstore.check(os.path.join(DAMAGED, "entry_crc.ledger"))
    assert not damaged.ok and damaged.files == 1
    assert all(f.kind == "damage" and f.offset is not None for f in damaged.findings)


def test_wrong_paths_raise_typed_errors(tmp_path) -> None:
    with pytest.raises(FileNotFoundError):
        bucketstore.check(tmp_path / "nothing here")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no \\*.ledger file"):
        bucketstore.check(tmp_path / "empty")
    with pytest.raises(ValueError, match="not a ledger file"):
        bucketstore.check_file(tmp_path / "empty")
    missing = bucketstore.check_file(tmp_path / "gone.ledger")  # a list of files: no guard around each
    assert [f.message for f in missing.findings] == ["ledger file is missing"]


def test_on_file_ticks_once_per_ledger_file(tmp_path) -> None:
    ticks = []
    bucketstore.check(_sealed_store(str(tmp_path / "s")), on_file=lambda: ticks.append(1))
    assert len(ticks) == 2


def test_verify_prints_the_report(tmp_path, capsys) -> None:
    """The command line is the report printed: the same findings, the same counts."""
    store = str(tmp_path / "j")
    _journal_with_torn_tail(store)
    report = bucketstore.check(store)
    assert cli.main(["verify", store]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:-1] == [str(f) for f in report.findings]
    assert out[-1].startswith(f"verified {report.files} file(s), {report.segments} segment(s), "
                              f"{report.indexes} index(es): ok, 1 warning(s)")
