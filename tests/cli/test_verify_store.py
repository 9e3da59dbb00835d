"""``verify`` / ``catalog`` on whole stores: journals, damage wording, a catalog without its lock file.

Issue 14: ``verify`` must read everything ``open`` would read, journals
included (item 7); the command line words damage as damage (minor); a
read-only catalog registers in LMDB's lock file, and when it cannot, reads
lock-less only while no writer holds the store (minor: it used ``lock=False``
always, and could see a torn view during a writer's commit).
"""

from __future__ import annotations

import errno
import glob
import os
import shutil
import subprocess
import sys
import tempfile

import struct

import pytest

import bucketstore
from bucketstore.cli import commands as cli
from bucketstore.errors import CatalogError, CorruptLedgerError, JournalError
from repo_paths import ROOT



def _header_size(journal: str) -> int:
    """The journal file's header length (formats/journal.md): fixed in version 1, with the identity in 2."""
    with open(journal, "rb") as f:
        data = f.read(64)
    (version,) = struct.unpack_from("<H", data, 8)
    if version == 1:
        return 24
    (name_len,) = struct.unpack_from("<H", data, 20 + 16)
    return 20 + 18 + name_len + 4


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _journal_store(path: str) -> str:
    """A journal-mode store whose one journal file holds a checkpoint group and five add groups."""
    with bucketstore.open(path, durability="journal") as store:
        tracker = store.tracker("j", clock=lambda: 1_000)
        for entry in range(5):
            tracker.add_message(1, entry, 10_000 + entry)  # one group each
    (journal,) = glob.glob(os.path.join(path, "journal", "*", "*.journal"))
    return journal


def _flip(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


def test_verify_reads_a_sound_journal(capsys, tmp_path) -> None:
    _journal_store(str(tmp_path / "s"))
    code, out, _ = run(capsys, "verify", str(tmp_path / "s"))
    assert code == 0 and out.endswith(": ok\n")
    assert out.startswith("verified 1 file(s)")  # the journal file (no bucket sealed yet)


def test_verify_reports_journal_damage_with_file_and_offset(capsys, tmp_path) -> None:
    journal = _journal_store(str(tmp_path / "s"))
    header = _header_size(journal)
    _flip(journal, header + 8 + 1)  # inside the checkpoint group's body: five groups follow
    code, out, _ = run(capsys, "verify", str(tmp_path / "s"))
    assert code == 1
    assert f"{journal}: offset {header}: group CRC mismatch, and more data follows: not a torn tail" in out
    with pytest.raises(JournalError):  # what open says about the same file
        with bucketstore.open(str(tmp_path / "s"), durability="journal") as store:
            store.tracker("j", clock=lambda: 1_000)


def test_verify_reports_a_damaged_journal_header(capsys, tmp_path) -> None:
    journal = _journal_store(str(tmp_path / "s"))
    _flip(journal, 12)  # the file number
    code, out, _ = run(capsys, "verify", str(tmp_path / "s"))
    assert code == 1 and f"{journal}: offset 0: bad journal header (magic or CRC)" in out


def test_a_torn_journal_tail_is_a_warning(capsys, tmp_path) -> None:
    journal = _journal_store(str(tmp_path / "s"))
    size = os.path.getsize(journal)
    with open(journal, "ab") as f:
        f.write((40).to_bytes(4, "little") + b"\x01\x02\x03\x04" + b"half")  # a group cut short by a crash
    code, out, _ = run(capsys, "verify", str(tmp_path / "s"))
    assert code == 0
    assert f"warning: {journal}: offset {size}: torn tail of 12 byte(s) from a crash (cut off on next open)" in out
    assert out.splitlines()[-1].endswith(": ok, 1 warning(s)")
    with bucketstore.open(str(tmp_path / "s"), durability="journal") as store:  # open cuts it and reads on
        assert store.tracker("j", clock=lambda: 1_000).number_of_delayed_messages == 5


def test_a_damaged_catalog_is_worded_as_such(capsys, tmp_path) -> None:
    path = str(tmp_path / "s")
    _journal_store(path)
    data = os.path.join(path, "catalog", "data.mdb")
    size = os.path.getsize(data)
    with open(data, "wb") as f:
        f.write(b"\xab" * size)  # same size: not the truncation case, just not LMDB
    for command in ("catalog", "stats", "dump"):
        code, out, err = run(capsys, command, path)
        assert code == 1 and "unexpected" not in err and "Traceback" not in err
        assert err.startswith(f"bucketstore: catalog: {os.path.join(path, 'catalog')}") and err.count("\n") == 1
    code, out, err = run(capsys, "verify", path)
    assert code == 1 and out.startswith(os.path.join(path, 'catalog'))


@pytest.mark.parametrize("error, line", [
    (CorruptLedgerError("/s/ledgers/1.ledger", 96, "entry 2: CRC mismatch"),
     "bucketstore: damaged ledger file: /s/ledgers/1.ledger: offset 96: entry 2: CRC mismatch\n"),
    (JournalError("/s/journal/6a/0.journal", 24, "group CRC mismatch"),
     "bucketstore: damaged journal: /s/journal/6a/0.journal: offset 24: group CRC mismatch\n"),
    (CatalogError("/s/catalog: tracker 'x' key 'k' holds b'?', not a ledger id", path="/s/catalog"),
     "bucketstore: catalog: /s/catalog: tracker 'x' key 'k' holds b'?', not a ledger id\n"),
    (OSError(errno.EIO, "Input/output error", "/s/ledgers"), "bucketstore: /s/ledgers: Input/output error\n"),
], ids=["ledger", "journal", "catalog", "oserror"])
def test_engine_errors_are_damage_not_unexpected(capsys, monkeypatch, tmp_path, error, line) -> None:
    path = str(tmp_path / "s")
    _journal_store(path)

    def fail(*args, **kwargs):
        raise error
    monkeypatch.setattr(cli, "describe_store", fail)
    code, out, err = run(capsys, "stats", path)
    assert (code, err) == (1, line)


# -- a reader that cannot write lock.mdb --------------------------------------------------------------
def _as_reader_without_write_access(store: str, *argv: str) -> subprocess.CompletedProcess:
    """Run the CLI as a user who may read the store but not write its catalog directory or lock file."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "bucketstore", *argv]
    if os.geteuid() == 0:  # root ignores permission bits unless it drops these capabilities
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv: cannot take write access away")
        command = ["setpriv", "--inh-caps=-all", "--bounding-set=-dac_override,-dac_read_search", *command]
    catalog = os.path.join(store, "catalog")
    lock = os.path.join(catalog, "lock.mdb")
    os.chmod(catalog, 0o555)
    if os.path.exists(lock):
        os.chmod(lock, 0o444)
    try:
        return subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    finally:
        os.chmod(catalog, 0o755)
        if os.path.exists(lock):
            os.chmod(lock, 0o644)


@pytest.fixture
def shared_store():
    """A sealed store."""
    top = tempfile.mkdtemp(prefix="bucketstore-ro-")
    path = os.path.join(top, "s")
    with bucketstore.open(path, durability="sealed") as store:
        tracker = store.tracker("t", config=bucketstore.TrackerConfig(min_index_count_per_bucket=3),
                                clock=lambda: 1_000)
        tracker.add_messages([(1, e, 10_000 + e) for e in range(5)])
        tracker.add_message(2, 0, 20_000)  # seals ledger 1
    yield path
    shutil.rmtree(top)


def test_lockless_reader_reads_a_store_no_writer_holds(shared_store) -> None:
    os.remove(os.path.join(shared_store, "catalog", "lock.mdb"))  # and the reader may not create it
    done = _as_reader_without_write_access(shared_store, "verify", shared_store)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.endswith("verified 1 file(s), 1 segment(s), 5 index(es): ok\n")
    assert not os.path.exists(os.path.join(shared_store, "catalog", "lock.mdb"))


def test_lockless_reader_refuses_beside_a_live_writer(shared_store) -> None:
    # The writer holds the store; the reader cannot register in lock.mdb, so an
    # unregistered read could see pages the writer reuses mid-read: refuse, say why.
    writer = subprocess.Popen([sys.executable, "-c", "import bucketstore, sys; s = bucketstore.open(sys.argv[1]); "
                               "print('open', flush=True); sys.stdin.read()", shared_store],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert writer.stdout.readline().strip() == "open"
        done = _as_reader_without_write_access(shared_store, "catalog", shared_store)
        assert done.returncode == 1 and "Traceback" not in done.stderr
        assert "cannot register as a reader in lock.mdb (no write access), and a writer has the store open" \
            in done.stderr
    finally:
        writer.stdin.close()
        writer.wait(timeout=60)
