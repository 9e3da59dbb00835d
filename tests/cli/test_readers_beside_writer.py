"""Read-only commands beside a live writer (issue 14, item 5).

A real writer process seals, merges, delivers and trims without pause, in
each durability mode, while ``verify``, ``catalog``, ``dump STORE`` and
``stats`` run in a loop on the same store: every run must exit 0 (the store
is healthy; files the writer creates or retires are in flight, not damage)
and none may leak an "unexpected error". The readers run in this process
(through ``bucketstore.cli.main``) so that many runs fit the time; the
writer is a separate process, as an operator's would be.

``BUCKETSTORE_READER_SECONDS`` (default 8) sets how long each mode is read.
Before the fix (a lock-less catalog read, one transaction per tracker, a
missing or unreferenced file taken as damage) 8 s failed within the first
seconds in both modes.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from bucketstore.cli import main
from repo_paths import SUPPORT

SECONDS = float(os.environ.get("BUCKETSTORE_READER_SECONDS", "8"))
WRITER = str(SUPPORT / "live_writer.py")
COMMANDS = [["verify"], ["catalog", "--json"], ["dump"], ["stats"], ["catalog"]]


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("durability", ["sealed", "journal"])
def test_read_only_commands_beside_a_sealing_merging_writer(tmp_path, durability):
    store = str(tmp_path / "store")
    writer = subprocess.Popen([sys.executable, WRITER, store, durability], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "ready", writer.stderr.read()
        failures: list[str] = []
        runs = 0
        allocators: set[int] = set()
        deadline = time.monotonic() + SECONDS
        while time.monotonic() < deadline and len(failures) < 5:
            command = COMMANDS[runs % len(COMMANDS)]
            code, out, err = _run([*command, store])
            runs += 1
            if code != 0 or "unexpected error" in err:
                failures.append(f"{' '.join(command)} exited {code}:\n{out[-2000:]}{err}")
            elif command == ["catalog", "--json"]:
                doc = json.loads(out)
                allocators.add(doc["next_ledger_id"])
                assert doc["writer_pid"] == str(writer.pid)
        assert writer.poll() is None, f"the writer died: {writer.stderr.read()}"
        assert not failures, f"{len(failures)} failed run(s) of {runs}:\n" + "\n".join(failures)
        # The writer sealed (and so merged and retired) while the readers ran.
        assert len(allocators) >= 2, f"the writer made no progress during {runs} runs"
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait()
