"""A side log: what a process about to be killed says it will do, durable before it does it.

Crash checks need a record that outlives the process under test: before each call whose
effect must survive (an add, a confirmation) the process appends one JSON line and fsyncs
it; after a SIGKILL the checker reads the lines back and knows which calls may have run.
``bucketstore simulate --durability journal`` and the test suite's SIGKILL writers use it.
"""

from __future__ import annotations

import json
import os
from typing import Any

__all__ = ["SideLog", "read_side_log"]


class SideLog:
    """Append-only JSON lines, each made durable before :meth:`write` returns."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        # A SIGKILL can cut a write() that crosses a page boundary (the kernel checks for a
        # fatal signal between pages): end such a torn line, so that this process's first
        # record starts a line of its own instead of being glued to the fragment.
        size = os.fstat(self._fd).st_size
        if size and os.pread(self._fd, 1, size - 1) != b"\n":
            os.write(self._fd, b"\n")
            os.fsync(self._fd)

    def write(self, record: dict[str, Any]) -> None:
        os.write(self._fd, (json.dumps(record, separators=(",", ":")) + "\n").encode())
        os.fsync(self._fd)  # before the call it announces, or before the process goes on

    def close(self) -> None:
        os.close(self._fd)


def read_side_log(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of a side log; lines cut by a kill are skipped.

    A torn line is a record whose write the kill interrupted, so the call it announces
    never ran (records are written before the call, or after it returned). It need not be
    the last line: the next writer appends after it (see :class:`SideLog`).
    """
    out: list[dict[str, Any]] = []
    if not os.path.exists(path):
        return out
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out
