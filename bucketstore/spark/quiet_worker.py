"""Keep PySpark's report of a stream Spark stopped reading off the console.

A query that needs only some rows (``show()``, ``limit``, ``take``, ``first``)
ends its task as soon as it has them, and the JVM closes the socket its Python
worker is still writing Arrow batches to. Since SPARK-54344 (PySpark 4.1) the
worker's daemon then kills the worker and, before it does, prints the failed
final flush (``BrokenPipeError`` in ``pyspark/daemon.py``) as a traceback on the
worker's stderr, which in local mode is the user's terminal. Nothing failed: the
query got its rows, and Spark starts a fresh worker for the next task. A reader
of bucketstore would still see a traceback after every ``df.show()``.

The data source cannot keep the JVM reading (there is no limit push-down for
Python data sources), so :func:`install` wraps the worker process's
``sys.stderr`` with a filter that drops exactly that report: a traceback whose
last line is a ``BrokenPipeError`` or ``ConnectionResetError`` and whose frames
are in ``pyspark/daemon.py`` (with the "failed to flush" line PySpark prints
before it when killing is turned off). Every other byte, every other traceback
included (a damaged ledger file's ``CorruptLedgerError`` goes to the driver
through Spark anyway), passes through unchanged and at once.
"""

from __future__ import annotations

import io
import re
import sys

__all__ = ["install", "QuietStderr"]

_FLUSH_NOTE = "PySpark daemon failed to flush the output to the worker process:"
_HEADER = "Traceback (most recent call last):"
_CLOSED = re.compile(r"^(BrokenPipeError|ConnectionResetError)\b")


class QuietStderr(io.TextIOBase):
    """A text stream passing everything to ``target`` but PySpark's early-close flush report."""

    def __init__(self, target: io.TextIOBase) -> None:
        self._target = target
        self._block: list[str] | None = None  # the lines of a report being judged
        self._partial = ""

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self._target, "encoding", "utf-8")

    @property
    def errors(self) -> str | None:  # type: ignore[override]
        return getattr(self._target, "errors", None)

    def fileno(self) -> int:
        return self._target.fileno()

    def isatty(self) -> bool:
        return self._target.isatty()

    def __getattr__(self, name: str) -> object:
        return getattr(self._target, name)  # buffer, errors, ...: the stream it wraps

    def write(self, text: str) -> int:
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()  # the text after the last newline: not a line yet
        out = []
        for line in lines:
            out.extend(self._judge(line))
        if self._block is None and self._partial and not self._partial.startswith((_HEADER, _FLUSH_NOTE)):
            out.append(self._partial)  # plain text without a newline: pass it on now
            self._partial = ""
        if out:
            self._target.write("".join(out))
            self._target.flush()
        return len(text)

    def _judge(self, line: str) -> list[str]:
        """The text to pass on now for one complete line."""
        block = self._block
        if block is None:
            if line in (_HEADER, _FLUSH_NOTE):
                self._block = [line]
                return []
            return [line + "\n"]
        block.append(line)
        if line == _HEADER or line.startswith(" ") or line == "":
            return []  # the report goes on: its header, frames and source lines
        self._block = None  # its last line, the exception: judge the whole report
        if _CLOSED.match(line) and any("pyspark/daemon.py" in frame for frame in block):
            return []
        return [kept + "\n" for kept in block]

    def flush(self) -> None:
        self._target.flush()


def install() -> None:
    """Wrap this process's ``sys.stderr`` (once): call it in the Python worker, from a task."""
    if not isinstance(sys.stderr, QuietStderr):
        sys.stderr = QuietStderr(sys.stderr)
