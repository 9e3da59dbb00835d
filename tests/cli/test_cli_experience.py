"""The newcomer's path through the command line: simulate leaves a store to look at, the next
commands show it, progress is a bar on a terminal and quiet in a pipe, and ``stats --plot``
draws a PNG or says in one line that the ``plot`` extra is missing.

Every command runs as a real subprocess (``python -m bucketstore``), piped or on a pty.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import struct
import termios
import subprocess
import sys
from pathlib import Path

import pytest

from repo_paths import GOLDEN

SMALL = ["--messages", "40000", "--rate", "4000", "--delay-window-ms", "60000", "--entries-per-ledger", "1000",
         "--deliver-for-ms", "30000"]


def cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bucketstore", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=600, cwd=cwd)


def on_pty(*args: str) -> tuple[int, str]:
    """Run the CLI with stdout and stderr on a pseudo-terminal; return (exit code, all it wrote)."""
    pid, fd = pty.fork()
    if pid == 0:  # child: exec at once, nothing of pytest runs here
        # a new pty is 0 x 0; give it the size of a usual terminal, as a real one has
        fcntl.ioctl(1, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
        os.execv(sys.executable, [sys.executable, "-m", "bucketstore", *args])
    chunks = []
    while True:
        try:
            data = os.read(fd, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(fd)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), b"".join(chunks).decode("utf-8", "replace")


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    store = tmp_path_factory.mktemp("cli") / "demo-store"
    return store, cli("simulate", str(store), *SMALL)


def test_simulate_without_a_store_uses_demo_store_in_the_working_directory(tmp_path: Path) -> None:
    first = cli("simulate", *SMALL, "--messages", "4000", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert (tmp_path / "demo-store" / "catalog" / "data.mdb").is_file()
    assert "demo-store" in first.stdout
    again = cli("simulate", *SMALL, "--messages", "4000", cwd=tmp_path)  # a second run reuses its store
    assert again.returncode == 0, again.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo-store"]


def test_simulate_leaves_a_backlog_the_oracle_accounts_for(demo) -> None:
    store, run = demo
    assert run.returncode == 0, run.stdout + run.stderr
    report = run.stdout
    assert "violations      0 " in report
    held = next(line for line in report.splitlines() if "held at stop" in line)
    numbers = [int(w.replace(",", "")) for w in held.replace("(", " ").replace(")", " ").split()
               if w.replace(",", "").isdigit()]
    assert numbers[0] > 0 and numbers[0] == numbers[-2], held  # held == what the oracle expects
    # it ends with the next commands, naming this store
    assert f"bucketstore stats {store}" in report and f"bucketstore verify {store}" in report


def test_the_next_commands_show_the_backlog(demo) -> None:
    store, _ = demo
    verify = cli("verify", str(store))
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert verify.stdout.rstrip().endswith("ok")
    stats = cli("stats", str(store), "--json")
    assert stats.returncode == 0
    doc = json.loads(stats.stdout)  # --json: stdout is one JSON document, no progress mixed in
    tracker = doc["trackers"]["simulate"]
    assert len(tracker["buckets"]) >= 1 and tracker["indexes"] > 0
    ledger = tracker["buckets"][0]["file"]
    dump = cli("dump", ledger, "--indexes", "2")
    assert dump.returncode == 0 and "segment" in dump.stdout
    # the command simulate printed for dump names a real file
    _, run = demo
    dump_hint = next(line for line in run.stdout.splitlines() if "bucketstore dump" in line).split()[2]
    assert os.path.isfile(dump_hint)
    # the read-only peek it prints runs as given, shows the backlog and changes nothing
    before = _tree(store)
    peek = next(line for line in run.stdout.splitlines() if line.strip().startswith("python -c"))
    code = peek.strip()[len('python -c "'):-1]
    looked = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert looked.returncode == 0, looked.stderr
    held = int(looked.stdout.split()[0])
    assert held > 0
    assert _tree(store) == before


def test_progress_is_lines_in_a_pipe_and_a_bar_on_a_terminal(tmp_path: Path) -> None:
    piped = cli("simulate", str(tmp_path / "piped"), *SMALL)
    assert piped.returncode == 0
    assert "\r" not in piped.stderr and "\r" not in piped.stdout
    assert "publish: 40,000 msg in" in piped.stderr  # one summary line per phase
    quiet = cli("simulate", str(tmp_path / "quiet"), *SMALL, "--no-progress")
    assert quiet.returncode == 0 and quiet.stderr == ""
    code, seen = on_pty("simulate", str(tmp_path / "tty"), *SMALL)
    assert code == 0, seen
    assert "publish" in seen and "\r" in seen and "msg/s" in seen  # tqdm redraws in place, with a rate


def test_verify_progress_never_touches_stdout(demo) -> None:
    store, _ = demo
    run = cli("verify", str(store))
    assert "\r" not in run.stdout + run.stderr
    assert "verify:" not in run.stdout


def test_stats_plot_writes_a_png(demo, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    store, _ = demo
    png = tmp_path / "due.png"
    run = cli("stats", str(store), "--plot", str(png))
    assert run.returncode == 0, run.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert "wrote" in run.stderr and "indexes" in run.stdout


def test_stats_plot_without_matplotlib_is_one_line_and_exit_2(demo, tmp_path: Path) -> None:
    store, _ = demo
    png = tmp_path / "due.png"
    blocker = ("import sys, runpy\n"
               "sys.modules['matplotlib'] = None  # as if the 'plot' extra were not installed\n"
               f"sys.argv = ['bucketstore', 'stats', {str(store)!r}, '--plot', {str(png)!r}]\n"
               "runpy.run_module('bucketstore', run_name='__main__')\n")
    run = subprocess.run([sys.executable, "-c", blocker], capture_output=True, text=True, timeout=300)
    assert run.returncode == 2
    assert run.stderr.count("\n") == 1 and "pip install 'bucketstore[plot]'" in run.stderr
    assert run.stdout == "" and not png.exists()


# -- journal mode: a broker process SIGKILLed and checked -------------------------------------------
JOURNAL_SMALL = ["--durability", "journal", "--messages", "12000", "--entries-per-ledger", "200",
                 "--delay-window-ms", "60000", "--deliver-for-ms", "10000",
                 "--kills", os.environ.get("BUCKETSTORE_SIMULATE_KILLS", "5")]


def test_journal_simulate_with_kills_leaves_a_store_that_verifies(tmp_path: Path) -> None:
    store = tmp_path / "journal-store"
    run = cli("simulate", str(store), *JOURNAL_SMALL)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "violations      0 " in run.stdout
    kills = next(line for line in run.stdout.splitlines() if line.strip().startswith("kills"))
    assert int(kills.split()[1]) >= 1, kills  # at least one broker was killed mid-work
    held = next(line for line in run.stdout.splitlines() if "held at stop" in line)
    assert "journal bytes left" in held and not held.split()[3] == "0"
    assert any((store / "journal").iterdir())
    verify = cli("verify", str(store))
    assert verify.returncode == 0, verify.stdout
    assert json.loads(cli("stats", str(store), "--json").stdout)["trackers"]["simulate"]["buckets"]


def test_journal_simulate_catches_a_store_that_drops_acknowledged_adds(tmp_path: Path, monkeypatch) -> None:
    """The checks can fail: a tracker that silently drops every 50th row it acknowledged is caught.

    The broker children are forked from this process, so they inherit the broken add_messages."""
    from bucketstore.cli import simulate_journal as sj
    from bucketstore.engine.tracker.tracker import BucketTracker

    real = BucketTracker.add_messages

    def lossy(self, rows):
        return real(self, [row for i, row in enumerate(rows) if i % 50 != 7])

    monkeypatch.setattr(BucketTracker, "add_messages", lossy)
    cfg = sj.JournalSimulationConfig(messages=3_000, entries_per_ledger=200, delay_window_ms=30_000,
                                     deliver_for_ms=5_000, kills=2)
    report = sj.run_journal_simulation(str(tmp_path / "s"), cfg, progress=False)
    assert report.lost > 0 and report.violations > 0


def test_verify_and_upgrade_draw_a_bar_on_a_terminal_only(demo) -> None:
    store, _ = demo
    for command in ("verify", "upgrade"):
        code, seen = on_pty(command, str(store))
        assert code == 0, seen
        assert f"{command}: " in seen and "\r" in seen and "/s]" in seen, seen  # tqdm: count, rate
        piped = cli(command, str(store))
        assert piped.returncode == 0 and piped.stderr == "" and "\r" not in piped.stdout


def test_stats_plot_of_a_store_without_buckets_says_so(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    import bucketstore
    from bucketstore.cli.plot import due_times, write_due_plot

    with bucketstore.open(tmp_path / "empty") as store:
        store.tracker("idle")
    assert due_times(str(tmp_path / "empty")) == {"idle": []}
    counts = write_due_plot(str(tmp_path / "empty"), str(tmp_path / "empty.png"))
    assert counts == {"indexes": 0, "buckets": 0}
    assert (tmp_path / "empty.png").read_bytes()[:4] == b"\x89PNG"


# -- clear refusals: a wrong path is one line and exit 2, and nothing is written -----------------
TINY = ["--messages", "2000", "--rate", "2000", "--delay-window-ms", "5000", "--entries-per-ledger", "500",
        "--deliver-for-ms", "1000", "--no-progress"]


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    """Every path below ``root`` with its size and mtime: what "nothing was written" compares."""
    out = {}
    for path in sorted(root.rglob("*")):
        st = path.stat()
        out[str(path.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return out


@pytest.fixture
def user_files(tmp_path: Path) -> Path:
    mine = tmp_path / "mine"
    (mine / "notes").mkdir(parents=True)
    (mine / "todo.txt").write_text("buy milk\n")
    (mine / "notes" / "a.md").write_text("# a\n")
    return mine


@pytest.mark.parametrize("argv", [["verify"], ["stats"], ["catalog"], ["dump"], ["repair", "--rebuild-catalog"],
                                  ["upgrade"], ["checkpoint"]])
def test_store_commands_refuse_a_directory_that_is_not_a_store(user_files: Path, argv: list[str]) -> None:
    before = _tree(user_files)
    extra = [str(user_files.parent / "copy")] if argv == ["checkpoint"] else []
    run = cli(*argv, str(user_files), *extra)
    assert not (user_files.parent / "copy").exists()
    assert run.returncode == 2, run.stdout + run.stderr
    assert run.stdout == "" and len(run.stderr.splitlines()) == 1, run.stderr
    assert "not a bucketstore store" in run.stderr and str(user_files) in run.stderr
    assert _tree(user_files) == before  # repair used to write LOCK and catalog/ among them


def test_verify_still_takes_a_directory_of_ledger_files(tmp_path: Path) -> None:
    import shutil
    golden = GOLDEN
    shutil.copy(golden / "several_ledgers.ledger", tmp_path / "b.ledger")
    run = cli("verify", str(tmp_path))
    assert run.returncode == 0 and run.stdout.startswith("verified 1 file(s)"), run.stdout + run.stderr


@pytest.mark.parametrize("target", ["directory", "file"])
def test_simulate_refuses_a_directory_of_other_files_or_a_file(user_files: Path, target: str) -> None:
    path = user_files if target == "directory" else user_files / "todo.txt"
    before = _tree(user_files)
    run = cli("simulate", str(path), *TINY)
    assert run.returncode == 2, run.stdout + run.stderr
    assert run.stdout == "" and len(run.stderr.splitlines()) == 1, run.stderr
    assert str(path) in run.stderr and "unexpected" not in run.stderr
    assert _tree(user_files) == before


def test_simulate_reuses_its_own_store_and_refuses_one_with_other_trackers(tmp_path: Path) -> None:
    import bucketstore

    store = tmp_path / "demo"
    store.mkdir()  # an empty directory is fine
    first = cli("simulate", str(store), *TINY)
    assert first.returncode == 0, first.stdout + first.stderr
    again = cli("simulate", str(store), *TINY)  # an earlier run's store: starts afresh
    assert again.returncode == 0, again.stdout + again.stderr
    assert "violations      0" in again.stdout
    with bucketstore.open(store, durability="sealed") as opened:
        opened.tracker("orders").add_message(1, 1, 2**40)
    # Reading the trackers registers in LMDB's reader table (catalog/lock.mdb), as every
    # read-only command does; nothing else may change.
    before = {k: v for k, v in _tree(store).items() if k != "catalog/lock.mdb"}
    refused = cli("simulate", str(store), *TINY)
    assert refused.returncode == 2 and len(refused.stderr.splitlines()) == 1, refused.stderr
    assert "'orders'" in refused.stderr
    assert {k: v for k, v in _tree(store).items() if k != "catalog/lock.mdb"} == before
    help_text = cli("simulate", "--help").stdout
    assert "earlier simulate" in help_text and "refused" in help_text
