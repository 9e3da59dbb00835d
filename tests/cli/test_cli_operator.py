"""The operator's view: --version, repair on a healthy store, what stats explains, dump of a
file that is not a ledger, how positions print."""

from __future__ import annotations

import os
import re

import pytest

import bucketstore
from bucketstore.cli import commands as cli
from helpers import SMALL, FakeClock, fill_and_seal


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def store(tmp_path) -> str:
    path = tmp_path / "s"
    with bucketstore.open(path, "journal") as s:
        t = s.tracker("t", SMALL, FakeClock(0))
        fill_and_seal(t, base=1000, ledgers=3)
        t.add_message(900, 1, 50_000)  # one more in the journal only
        t.flush()
    return str(path)


def test_version(capsys) -> None:
    code, out, err = run(capsys, "--version")
    assert code == 0 and out == f"bucketstore {bucketstore.__version__}\n" and err == ""


def test_repair_of_a_healthy_store_has_nothing_to_do_and_succeeds(capsys, store) -> None:
    before = sorted(os.listdir(store))
    code, out, err = run(capsys, "repair", "--rebuild-catalog", store)
    assert code == 0 and err == ""
    assert out.startswith("nothing to rebuild: ") and out.count("\n") == 1
    assert sorted(os.listdir(store)) == before  # no catalog set aside


def test_stats_shows_journal_bytes_and_what_verify_counts(capsys, store) -> None:
    code, out, _ = run(capsys, "stats", store)
    assert code == 0
    journal_root = os.path.join(store, "journal")
    files = [os.path.join(r, f) for r, _, fs in os.walk(journal_root) for f in fs if f.endswith(".journal")]
    assert files
    size = sum(os.path.getsize(f) for f in files)
    assert re.search(rf"^journal      {len(files)} file\(s\), {size} bytes$", out, re.M), out
    said = int(re.search(r"^verify       checks (\d+) file\(s\)", out, re.M).group(1))
    code, verified, _ = run(capsys, "verify", store)
    assert code == 0 and verified.startswith(f"verified {said} file(s)")
    ledger_files = int(re.search(r"^ledger files (\d+)", out, re.M).group(1))
    assert said == ledger_files + len(files)  # here every ledger file is referenced


def test_stats_of_a_sealed_store_says_it_has_no_journal(capsys, tmp_path) -> None:
    with bucketstore.open(tmp_path / "s", "sealed") as s:
        fill_and_seal(s.tracker("t", SMALL, FakeClock(0)), base=1000, ledgers=1)
    code, out, _ = run(capsys, "stats", str(tmp_path / "s"))
    assert code == 0 and "journal      none (sealed mode" in out


def test_positions_print_as_none_or_ledger_colon_entry(capsys, store) -> None:
    _, out, _ = run(capsys, "stats", store)
    assert "mark-delete none" in out and "None" not in out
    with bucketstore.open(store, "journal") as s:
        s.tracker("t", SMALL, FakeClock(0)).mark_delete(0, 5)
    _, out, _ = run(capsys, "catalog", store)
    assert "mark-delete 0:5" in out


@pytest.mark.parametrize("content", [b"hello, world\n", b"", bytes(100)])
def test_dump_of_a_file_that_is_not_a_ledger_says_so(capsys, tmp_path, content) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes(content)
    code, out, err = run(capsys, "dump", str(path))
    assert code == 2 and out == ""
    assert err == f"bucketstore: {path}: not a ledger file nor a topic run file (no magic at its start or end); " \
                  "dump takes a ledger file, a topic run file or a store\n"
    # A file named as a ledger is one, damaged: that stays DAMAGE (exit 1).
    named = tmp_path / f"{7:020d}.ledger"
    named.write_bytes(content)
    code, out, _ = run(capsys, "dump", str(named))
    assert code == 1 and "DAMAGE" in out


@pytest.mark.parametrize("span_s, pattern", [
    (20, r"\d\d:\d\d:\d\d(\n[A-Z][a-z]{2} \d\d)?"),      # seconds: never a bare "05"
    (3 * 3600, r"\d\d:\d\d(\n[A-Z][a-z]{2} \d\d)?"),      # across midnight: 00:00 keeps its time
    (30 * 3600, r"\d\d:\d\d(\n[A-Z][a-z]{2} \d\d)?"),
    (20 * 86_400, r"[A-Z][a-z]{2} \d\d"),                 # days: never a bare "17"
    (200 * 86_400, r"[A-Z][a-z]{2} \d{4}"),
])
def test_the_plot_labels_every_major_tick_readably(span_s, pattern) -> None:
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt
    from datetime import datetime, timedelta, timezone
    from bucketstore.cli.plot import _label_time_axis

    t0 = datetime(2023, 11, 14, 22, 24, 50, tzinfo=timezone.utc)
    fig, ax = plt.subplots(figsize=(11, 3.6))
    try:
        ax.bar([t0, t0 + timedelta(seconds=span_s)], [1, 2], width=span_s / 86_400 / 50)
        _label_time_axis(ax, mdates)
        fig.canvas.draw()
        ticks = [mdates.num2date(v) for v in ax.get_xticks()]
        labels = [t.get_text() for t in ax.get_xticklabels()]
    finally:
        plt.close(fig)
    assert len(labels) >= 3
    # Each label, with the last date shown before it, names its tick exactly.
    date = None
    for tick, label in zip(ticks, labels):
        assert re.fullmatch(pattern, label), (label, labels)
        if ":" not in label:
            assert label in (f"{tick:%b %d}", f"{tick:%b %Y}"), (label, tick)
            continue
        time, _, shown = label.partition("\n")
        date = shown or date
        assert date == f"{tick:%b %d}", (label, tick, labels)  # the first tick and each new day carry it
        assert time == f"{tick:%H:%M:%S}"[:len(time)] and (len(time) == 8 or tick.second == 0), (label, tick)
