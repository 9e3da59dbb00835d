"""Sorting delayed-index rows by (timestamp, ledger, entry), fast.

``np.lexsort`` over three uint64 columns makes three stable passes and then
gathers every column through the permutation: about 0.24 s for a million
rows. But the rows a bucket holds usually span a narrow range in each column
(a few hours of timestamps, a few ledgers, entry ids below a few million), so
the three offsets from each column's minimum fit together in one 64-bit key.
Sorting those keys is one call to numpy's vectorised sort (AVX-512 where the
CPU has it), and the columns come back out of the keys with shifts and masks,
without a gather. When the ranges are too wide for 64 bits, lexsort it is.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from .shared_work import RunBeside, share

__all__ = ["SPLIT_ROWS", "sort_row_parts", "sort_rows"]

_U64 = np.dtype("<u8")


def _bits(span: int) -> int:
    return int(span).bit_length()


def sort_rows(ts: np.ndarray, ledgers: np.ndarray, entries: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rows sorted by (timestamp, ledger, entry), as three new uint64 columns.

    Equal rows stay (callers that must drop them use ``drop_repeats``).
    """
    ts = np.asarray(ts, dtype=_U64)
    ledgers = np.asarray(ledgers, dtype=_U64)
    entries = np.asarray(entries, dtype=_U64)
    if len(ts) < 2:
        return ts.copy(), ledgers.copy(), entries.copy()
    return sort_row_parts([(ts, ledgers, entries)])


def sort_row_parts(parts: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]], *, sorted_parts: bool = False,
                   run_beside: RunBeside | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rows of several parts (each three columns) sorted together, as :func:`sort_rows`
    of their concatenation gives them, without making the concatenation.

    Each part's keys are written straight into one key array: a seal's frozen runs or a
    merge's segments need no concatenated copy of the three columns (for a 4 M-row merge,
    96 MB fewer to allocate, fault in and copy). Every step is a numpy call that releases
    the GIL on large arrays (bench_maintenance ``steps``).

    ``sorted_parts``: each part is sorted already (a seal's runs, a merge's segments). When
    they make few runs (a merge's: consecutive segments of a bucket make one) the keys are sorted
    by numpy's stable sort, a timsort, which finds the runs and merges them: about a fifth
    less time than its quicksort for 4 runs of a million rows. (On unsorted keys, or on many
    short runs, it is slower.)

    ``run_beside(fn)`` starts ``fn`` on another thread and returns a callable that waits for
    its result (``engine.threads.side_thread.run_beside``): given one, sorted parts of
    :data:`SPLIT_ROWS` rows or more are cut into ranges of timestamps holding about as many
    rows each (at sampled quantiles, each part at its own binary searches), and each range is
    packed, sorted and unpacked into its own slice of the output, by this thread or the one
    beside it (:func:`~bucketstore.format.shared_work.share`). Every row of a range precedes
    every row of the next, so the result is one sort's.
    """
    cols = [tuple(np.asarray(c, dtype=_U64) for c in part) for part in parts if len(part[0])]
    n = sum(len(c[0]) for c in cols)
    if n < 2:
        if not cols:
            return np.zeros(0, dtype=_U64), np.zeros(0, dtype=_U64), np.zeros(0, dtype=_U64)
        return cols[0][0].copy(), cols[0][1].copy(), cols[0][2].copy()
    if sorted_parts:  # a sorted part's timestamps are its first and last
        t0, t_top = min(int(c[0][0]) for c in cols), max(int(c[0][-1]) for c in cols)
    else:
        t0, t_top = min(int(c[0].min()) for c in cols), max(int(c[0].max()) for c in cols)
    l0 = min(int(c[1].min()) for c in cols)
    e0 = min(int(c[2].min()) for c in cols)
    tb = _bits(t_top - t0)
    lb = _bits(max(int(c[1].max()) for c in cols) - l0)
    eb = _bits(max(int(c[2].max()) for c in cols) - e0)
    if tb + lb + eb > 64:
        ts, ledgers, entries = (np.concatenate(c) for c in zip(*cols)) if len(cols) > 1 else cols[0]
        order = np.lexsort((entries, ledgers, ts))
        return ts[order], ledgers[order], entries[order]
    fields = _Fields(t0, l0, e0, tb, lb, eb)
    kind = "stable" if sorted_parts and _runs(cols) <= STABLE_RUNS else "quicksort"
    bounds = _ranges(cols, n) if run_beside is not None and sorted_parts and n >= SPLIT_ROWS else None
    if bounds is None:
        return _sort_keys(cols, n, fields, kind)
    out = tuple(np.empty(n, dtype=_U64) for _ in range(3))
    pieces, lo = [], 0
    for a, b in zip(bounds, bounds[1:]):
        piece = [(ts[i:j], ledgers[i:j], entries[i:j]) for (ts, ledgers, entries), i, j in zip(cols, a, b)]
        hi = lo + sum(j - i for i, j in zip(a, b))
        if hi > lo:
            # (Fresh pages: each range's are first written, and so faulted in, by the thread sorting it.)
            pieces.append(functools.partial(_sort_into, piece, fields, kind, tuple(c[lo:hi] for c in out)))
        lo = hi
    share(pieces, run_beside)
    return out


#: Rows from which :func:`sort_row_parts` given ``run_beside`` sorts ranges of them on two
#: threads: a merge of big buckets, not a seal (docs/maintenance.md, "Both cores for one job":
#: a 1 M seal would save about a tenth of its CPU time on two free cores, and lose half its wall
#: time to a second thread on a busy machine).
SPLIT_ROWS = 2_000_000
#: Rows of a range, about: enough ranges for the two threads to even out, few enough that each
#: range's calls cost little beside its sort.
RANGE_ROWS = 250_000
#: Runs of sorted parts up to which the stable sort (a timsort merging them) is chosen.
STABLE_RUNS = 8
#: Timestamps sampled to place the cuts between ranges.
_SAMPLE = 4096


class _Fields(NamedTuple):
    """Each column's minimum and bit width: key = (ts - t0) << (lb + eb) | (ledger - l0) << eb | (entry - e0)."""

    t0: int
    l0: int
    e0: int
    tb: int
    lb: int
    eb: int


def _runs(cols: list[tuple[np.ndarray, ...]]) -> int:
    """How many sorted runs the sorted parts make, in order (a part that starts after the one
    before it ends continues its run: a bucket's consecutive segments)."""
    runs = 1
    for (ts, ledgers, entries), (t2, l2, e2) in zip(cols, cols[1:]):
        if (int(ts[-1]), int(ledgers[-1]), int(entries[-1])) > (int(t2[0]), int(l2[0]), int(e2[0])):
            runs += 1
    return runs


def _ranges(cols: list[tuple[np.ndarray, ...]], n: int) -> list[list[int]] | None:
    """Cuts of sorted parts into ranges of timestamps: per cut, the position in each part of
    its first row at or above the cut's timestamp, from all zeros to the parts' lengths (None
    when no cut leaves rows on both sides: every row has the smallest timestamp)."""
    ranges = max(2, min(8, -(-n // RANGE_ROWS)))
    step = max(1, n // _SAMPLE)
    sample = np.sort(np.concatenate([ts[::step] for ts, _, _ in cols]))  # (as many from a part as it has rows)
    cuts = np.unique(sample[[len(sample) * k // ranges for k in range(1, ranges)]])
    # (One search of all the cuts a part: a merge of small segments has hundreds of parts.)
    at = np.array([np.searchsorted(ts, cuts, side="left") for ts, _, _ in cols]).T.tolist()
    bounds = [[0] * len(cols)] + [a for a in at if 0 < sum(a) < n]
    if len(bounds) == 1:
        return None
    bounds.append([len(ts) for ts, _, _ in cols])
    return bounds


def _sort_keys(cols: list[tuple[np.ndarray, ...]], n: int, f: _Fields, kind: str
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rows sorted into new columns, on this thread: the key array becomes the timestamp
    column, its scratch array the entry column (no other buffer is allocated)."""
    key = np.empty(n, dtype=_U64)
    scratch = np.empty(max(len(c[0]) for c in cols), dtype=_U64)
    _pack(cols, key, scratch, f)
    key.sort(kind=kind)
    if len(scratch) < n:
        scratch = np.empty(n, dtype=_U64)
    if f.eb:
        out_e = np.bitwise_and(key, np.uint64((1 << f.eb) - 1), out=scratch)
        out_e += np.uint64(f.e0)
    else:
        out_e = np.full(n, f.e0, dtype=_U64)
    out_l = np.empty(n, dtype=_U64)
    _unpack_ledgers(key, f, out_l)
    # (When tb is 0, lb + eb may be 64, a shift numpy does not define: the column is constant.)
    if not f.tb:
        out_t = np.full(n, f.t0, dtype=_U64)
    else:
        if f.lb + f.eb:
            key >>= np.uint64(f.lb + f.eb)
        key += np.uint64(f.t0)
        out_t = key
    return out_t, out_l, out_e


def _sort_into(cols: list[tuple[np.ndarray, ...]], f: _Fields, kind: str,
               out: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
    """Sort the rows of ``cols`` into the given output slices (as many rows as the parts hold),
    with no other buffer: the keys are packed into the timestamp slice (the entry slice is the
    packing's scratch) and unpacked from it, the timestamps last."""
    cols = [c for c in cols if len(c[0])]
    if not cols:
        return
    out_t, out_l, out_e = out
    key = out_t
    _pack(cols, key, out_e, f)
    key.sort(kind=kind)
    if f.eb:
        np.bitwise_and(key, np.uint64((1 << f.eb) - 1), out=out_e)
        out_e += np.uint64(f.e0)
    else:
        out_e.fill(f.e0)
    _unpack_ledgers(key, f, out_l)
    if not f.tb:
        out_t.fill(f.t0)
    else:
        if f.lb + f.eb:
            key >>= np.uint64(f.lb + f.eb)
        key += np.uint64(f.t0)


def _pack(cols: list[tuple[np.ndarray, ...]], key: np.ndarray, scratch: np.ndarray, f: _Fields) -> None:
    """Write each part's keys into consecutive slices of ``key``.

    Ordering the keys orders the rows exactly as (ts, ledger, entry) does, since every part
    is unsigned and fits its field."""
    t0u, l0u, e0u = np.uint64(f.t0), np.uint64(f.l0), np.uint64(f.e0)
    lo = 0
    for ts, ledgers, entries in cols:
        hi = lo + len(ts)
        k, s = key[lo:hi], scratch[:hi - lo]
        np.subtract(ts, t0u, out=k)
        if f.lb + f.eb:
            k <<= np.uint64(f.lb + f.eb)
        if f.lb:
            np.subtract(ledgers, l0u, out=s)
            s <<= np.uint64(f.eb)
            k |= s
        if f.eb:
            np.subtract(entries, e0u, out=s)
            k |= s
        lo = hi


def _unpack_ledgers(key: np.ndarray, f: _Fields, out: np.ndarray) -> None:
    if f.lb:
        np.right_shift(key, np.uint64(f.eb), out=out)
        out &= np.uint64((1 << f.lb) - 1)
        out += np.uint64(f.l0)
    else:
        out.fill(f.l0)
