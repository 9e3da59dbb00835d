"""Progress of long commands (simulate, verify, upgrade): tqdm bars on a terminal, lines when piped.

Only the command line shows progress; the library never prints. On a terminal
(stderr is a tty) a phase is a tqdm bar with its rate and ETA, redrawn in place.
Anywhere else (a pipe, a file, CI) a redrawn bar would fill the log with
carriage returns, so a phase writes at most one plain line when it ends
("verify: 12 files in 0.4 s"), and nothing at all with ``quiet``. Everything
goes to stderr: stdout stays the command's result (text or ``--json``).
"""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import TextIO

from tqdm import tqdm

__all__ = ["Progress", "on_terminal"]

# No monitor thread: `simulate --durability journal` forks broker processes while a bar is
# open, and a fork should copy a process with no other thread in it.
tqdm.monitor_interval = 0


def on_terminal(stream: TextIO | None = None) -> bool:
    """Whether ``stream`` (stderr by default) is an interactive terminal."""
    stream = sys.stderr if stream is None else stream
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


class Progress:
    """One phase of work: ``with Progress("verify", total=n, unit="file") as p: ... p.update()``.

    :param quiet: show nothing (``--no-progress``, or a ``--json`` run that wants stderr clean).
    :param stream: where to draw (stderr by default); a bar only when it is a terminal.
    :param line_when_piped: off a terminal, write the one summary line (False: nothing,
        for commands whose stderr scripts read, such as verify).
    """

    def __init__(self, phase: str, total: int | None, *, unit: str = "it", quiet: bool = False,
                 stream: TextIO | None = None, line_when_piped: bool = True) -> None:
        self.phase = phase
        self.unit = unit
        self.done = 0
        self._stream = sys.stderr if stream is None else stream
        self._quiet = quiet
        self._started = time.perf_counter()
        self._bar: tqdm | None = None
        if not quiet and not on_terminal(self._stream):
            self._quiet = not line_when_piped
        elif not quiet:
            self._bar = tqdm(total=total, desc=phase, unit=unit, file=self._stream, leave=True,
                             dynamic_ncols=True, unit_scale=total is not None and total >= 10_000)

    def update(self, n: int = 1, *, total: int | None = None) -> None:
        """Count ``n`` more units done; ``total`` sets the total once it is known."""
        self.done += n
        if self._bar is not None:
            if total is not None and self._bar.total != total:
                self._bar.total = total
                self._bar.refresh()
            self._bar.update(n)

    def close(self) -> None:
        """End the phase: close the bar, or write its one summary line when not on a terminal."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif not self._quiet:
            seconds = time.perf_counter() - self._started
            self._stream.write(f"{self.phase}: {self.done:,} {self.unit} in {seconds:.1f} s\n")
            self._stream.flush()
        self._quiet = True  # a second close writes nothing

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is not None and self._bar is None:
            self._quiet = True  # a failed phase: its error says enough
        self.close()
