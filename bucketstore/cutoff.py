"""Argument checks and the delivery cutoff shared by every tracker."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from .config import TrackerConfig

__all__ = ["Clock", "system_clock", "Cutoff", "check_position", "check_timestamp", "check_max", "as_columns"]

Clock = Callable[[], int]
_U64_LIMIT = 1 << 64


def system_clock() -> int:
    """Epoch milliseconds from the system clock."""
    return time.time_ns() // 1_000_000


class Cutoff:
    """``now + tick`` (or ``now`` when strict), never moving backwards even if the clock does.

    A clock that steps back (NTP, a VM restored) must not make indexes that were
    already judged due become not-due again: that would re-order deliveries and
    break the "delivered set is a prefix of the index order" property.
    """

    __slots__ = ("_clock", "_offset", "_value")

    def __init__(self, config: TrackerConfig, clock: Clock | None) -> None:
        if clock is not None and not callable(clock):
            raise TypeError("clock must be a callable returning epoch milliseconds")
        self._clock = clock or system_clock
        self._offset = 0 if config.deliver_at_time_strict else config.tick_time_ms
        self._value = -1

    @staticmethod
    def _coerce(value: object) -> int:
        """Accept a float clock (``time.time() * 1000``); refuse anything else (bool included)."""
        if isinstance(value, float):
            return int(value)
        if isinstance(value, int) and not isinstance(value, bool):
            return int(value)  # an int subclass, e.g. numpy's
        raise TypeError(f"clock returned {type(value).__name__}, not int milliseconds")

    def advance(self) -> int:
        """Read the clock and return the (monotonic) cutoff."""
        value = self._clock()
        candidate = (value if type(value) is int else self._coerce(value)) + self._offset
        if candidate > self._value:
            self._value = candidate
        return self._value

    def raise_to(self, floor: int) -> None:
        """Never let the cutoff fall below ``floor`` (a cutoff reached before a restart)."""
        if floor > self._value:
            self._value = floor

    @property
    def lead_ms(self) -> int:
        """How long before its time an index falls due: the tick, or 0 when strict."""
        return self._offset

    @property
    def value(self) -> int:
        """The last cutoff computed, without reading the clock."""
        return self._value


def _numpy_hint(value: object) -> str:
    """What to do with a numpy integer, which a single add refuses (it would reach the journal's
    msgpack and the catalog as a foreign type)."""
    return " (int(x) converts one; add_messages takes numpy columns as they are)" \
        if isinstance(value, np.integer) else ""


def check_position(ledger_id: object, entry_id: object) -> None:
    """Raise TypeError/ValueError unless both are unsigned 64-bit ints."""
    if type(ledger_id) is int and type(entry_id) is int and 0 <= ledger_id < _U64_LIMIT \
            and 0 <= entry_id < _U64_LIMIT:
        return  # the hot path: plain ints in range
    for name, value in (("ledger_id", ledger_id), ("entry_id", entry_id)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, not {type(value).__name__}{_numpy_hint(value)}")
        if not 0 <= value < _U64_LIMIT:
            raise ValueError(f"{name} {value} is not an unsigned 64-bit int")


def check_timestamp(deliver_at: object) -> None:
    """Raise TypeError unless ``deliver_at`` is an int (negative values are allowed: they are due)."""
    if type(deliver_at) is int and deliver_at < _U64_LIMIT:
        return
    if isinstance(deliver_at, bool) or not isinstance(deliver_at, int):
        raise TypeError(f"deliver_at must be an int (epoch ms), not {type(deliver_at).__name__}"
                        f"{_numpy_hint(deliver_at)}")
    if deliver_at >= _U64_LIMIT:
        raise ValueError(f"deliver_at {deliver_at} does not fit an unsigned 64-bit int")


def check_max(max_messages: object) -> int:
    if isinstance(max_messages, bool) or not isinstance(max_messages, int):
        raise TypeError(f"max_messages must be an int, not {type(max_messages).__name__}")
    if max_messages < 0:
        raise ValueError(f"max_messages must be >= 0, not {max_messages}")
    return max_messages


_U64 = np.dtype("<u8")


_COLUMN_NAMES = ("ledger_id", "entry_id", "deliver_at")
_BATCH_RULE = ("a batch is columns (ledger_ids, entry_ids, deliver_at) as a tuple of three lists or 1-D arrays, "
               "or a mapping of 'ledger_id', 'entry_id', 'deliver_at' to columns; or rows as an (n, 3) array or "
               "a list (any iterable but a tuple of three) of (ledger_id, entry_id, deliver_at) triples")
_EITHER = ("ambiguous batch: a tuple of three could be three rows (ledger_id, entry_id, deliver_at) or three "
           "columns (ledger_ids, entry_ids, deliver_at); pass rows as a list of tuples, columns as a tuple of "
           "three lists or 1-D arrays")


def _column_like(value: object) -> bool:
    """A container a batch's column may come in: a list, a range, an array (never a tuple: rows are)."""
    return isinstance(value, (list, range, np.ndarray)) or (
        hasattr(value, "__array__") and not isinstance(value, (tuple, str, bytes)))


def as_columns(indexes: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Normalise a batch to columns: ``ledger_ids`` and ``entry_ids`` as uint64, ``deliver_at`` as given (signed allowed).

    The forms, told apart by the types of the containers, never by how many indexes there are:

    * **columns**: a tuple of exactly three lists or one-dimensional arrays
      (numpy arrays, ranges, anything with ``__array__``)
      ``(ledger_ids, entry_ids, deliver_at)``, of any (equal) length, three
      included: ``([1, 1, 1], [0, 1, 2], [t, t, t])`` is three indexes of ledger 1;
      or a mapping with the keys ``"ledger_id"``, ``"entry_id"`` and
      ``"deliver_at"``;
    * **rows**: a two-dimensional numpy array of shape ``(n, 3)``, or any other
      iterable of ``(ledger_id, entry_id, deliver_at)`` triples (a list of tuples,
      a generator, a tuple of n triples when n is not 3).

    A tuple of exactly three tuples could be three rows or three columns (what
    ``zip(*rows)`` gives), and a tuple of three mixing tuples with lists or
    arrays could be either too: both raise TypeError naming the two readings
    rather than guess. So does a list of exactly three numpy arrays of length 3.
    """
    if isinstance(indexes, Mapping):
        if set(indexes) != set(_COLUMN_NAMES):
            raise TypeError(f"a named batch has exactly the keys {', '.join(map(repr, _COLUMN_NAMES))}, "
                            f"not {', '.join(map(repr, indexes))}")
        cols = [np.asarray(indexes[name]) for name in _COLUMN_NAMES]
        if any(c.ndim != 1 for c in cols):
            raise TypeError("the columns of a named batch must be one-dimensional")
    elif isinstance(indexes, np.ndarray):
        if indexes.ndim != 2 or indexes.shape[1] != 3:
            raise TypeError(f"a batch as one numpy array has shape (n, 3), not {indexes.shape}; " + _BATCH_RULE)
        cols = [indexes[:, 0], indexes[:, 1], indexes[:, 2]]
    elif isinstance(indexes, tuple) and len(indexes) == 3 and any(map(_column_like, indexes)):
        if not all(map(_column_like, indexes)):
            raise TypeError(_EITHER + "; it mixes tuples or values with lists or arrays")
        cols = [np.asarray(c) for c in indexes]
        if any(c.ndim != 1 for c in cols):
            raise TypeError("the three columns of a batch must be one-dimensional; " + _BATCH_RULE)
    elif isinstance(indexes, tuple) and len(indexes) == 3 and all(isinstance(c, tuple) for c in indexes):
        raise TypeError(_EITHER + "; it holds three tuples")
    else:
        if isinstance(indexes, (str, bytes)) or not isinstance(indexes, Iterable):
            raise TypeError(_BATCH_RULE + f", not {type(indexes).__name__}")
        rows = list(indexes)
        if not rows:
            return (np.zeros(0, _U64),) * 3  # type: ignore[return-value]
        if len(rows) == 3 and all(isinstance(r, np.ndarray) and r.shape == (3,) for r in rows):
            raise TypeError("three numpy arrays of length 3 could be rows or columns; pass columns as a "
                            "tuple of arrays, rows as tuples or an (n, 3) array")
        try:
            cols = [np.asarray(c) for c in zip(*rows, strict=True)]
        except (TypeError, ValueError):
            raise TypeError(_BATCH_RULE) from None
        if len(cols) != 3:
            raise TypeError(_BATCH_RULE)
    if not len(cols[0]) == len(cols[1]) == len(cols[2]):
        raise ValueError("batch columns differ in length")
    out = []
    for name, col in zip(("ledger_id", "entry_id", "deliver_at"), cols):
        if col.dtype == object or not (np.issubdtype(col.dtype, np.integer)):
            if len(col) == 0:
                col = col.astype(np.int64)
            else:
                raise TypeError(f"batch {name} values must be ints")
        if np.issubdtype(col.dtype, np.signedinteger) and len(col) and int(col.min()) < 0:
            if name != "deliver_at":
                raise ValueError(f"batch {name} values must be unsigned 64-bit ints")
        out.append(col)
    ledgers = out[0].astype(_U64)
    entries = out[1].astype(_U64)
    deliver_at = out[2]
    return ledgers, entries, deliver_at  # deliver_at keeps its sign: negative means due
