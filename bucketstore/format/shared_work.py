"""Independent pieces of one job done by two threads, each taking the next piece not taken yet.

A big seal or merge cuts its sort (by timestamp ranges), its segment encode (by runs of whole
segments) and a merge its reads into pieces whose results do not depend on which thread made
them. The caller's thread and one beside it (``run_beside``, from the engine) take pieces in
order until none is left; the results come back in piece order, so the output is what one
thread makes. Taking pieces as they come, not a half each, keeps both threads busy when one
of them also has work of its own (the bitmaps of entry 0) or loses its core for a while to
another process: the other one takes more pieces.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np

from .segment_codec import encode_segments

__all__ = ["ENCODE_PIECE_ROWS", "RunBeside", "encode_in_pieces", "piece_bounds", "share"]

T = TypeVar("T")

#: ``run_beside(fn)`` starts ``fn()`` on another thread and returns a callable that waits for it
#: and returns its result, or raises what it raised (``engine.threads.side_thread.run_beside``).
RunBeside = Callable[[Callable[[], None]], Callable[[], None]]


def share(pieces: Sequence[Callable[[], T]], run_beside: RunBeside, *,
          first: Callable[[], object] | None = None) -> list[T]:
    """Run ``pieces`` on this thread and one beside it; their results in piece order.

    ``first`` runs on this thread before it takes pieces (the thread beside starts on them at
    once). A piece that raises stops the thread it ran on; the other takes the pieces left, and
    the first failure is raised once both are done (nothing runs on after the call).
    """
    results: list[T | None] = [None] * len(pieces)
    taken = itertools.count()  # (its __next__ is one C call: no piece is taken twice)

    def drain() -> None:
        while (i := next(taken)) < len(pieces):
            results[i] = pieces[i]()

    beside = run_beside(drain)
    try:
        if first is not None:
            first()
        drain()
    finally:
        beside()  # (waited for even when this side failed)
    return results  # type: ignore[return-value]


def piece_bounds(starts: np.ndarray, n: int, rows: int, most: int = 16) -> list[int]:
    """Cut ``n`` rows of consecutive items (item ``i`` begins at row ``starts[i]``, the first at
    0: a bucket's segments) into pieces of whole items of about ``rows`` rows each, at least two
    and at most ``most`` of them where the items allow: each piece's first item, then
    ``len(starts)``."""
    pieces = max(2, min(most, -(-n // rows)))
    at = np.searchsorted(starts, [n * k // pieces for k in range(1, pieces)]).tolist()
    return [0, *sorted({a for a in at if 0 < a < len(starts)}), len(starts)]


#: Rows of a piece of segments encoded at once by either thread, about: enough pieces for the two
#: threads to even out, few enough that each piece's calls cost little beside its encoding.
ENCODE_PIECE_ROWS = 125_000


def encode_in_pieces(ts: np.ndarray, ledgers: np.ndarray, entries: np.ndarray, starts: np.ndarray,
                     run_beside: RunBeside, *, first: Callable[[], object] | None = None,
                     **options: object) -> list[bytes]:
    """``encode_segments(ts, ledgers, entries, starts, check=False, **options)``, in pieces of
    whole segments (:data:`ENCODE_PIECE_ROWS` rows, about) that this thread (once ``first`` has
    run) and one beside it take as they come: the same payloads, since each segment's bytes
    depend on its rows alone."""
    firsts = piece_bounds(starts, len(ts), ENCODE_PIECE_ROWS)
    rows = [*starts[firsts[:-1]].tolist(), len(ts)]

    def piece(k: int) -> Callable[[], list[bytes]]:
        lo, hi = rows[k], rows[k + 1]
        segments = starts[firsts[k]:firsts[k + 1]] - lo
        return lambda: encode_segments(ts[lo:hi], ledgers[lo:hi], entries[lo:hi], segments, check=False,
                                       **options)  # type: ignore[arg-type]

    return [p for chunk in share([piece(k) for k in range(len(firsts) - 1)], run_beside, first=first) for p in chunk]
