"""A topic's journal in ``durability="journal"`` (``docs/topics.md``, "Durability"; ``formats/journal.md``).

An add to a topic is answered at once and kept in memory (the topic's pending rows); the group
commit makes it durable by appending it here and fsyncing once, as a tracker's journal does,
instead of committing it to the LMDB level (an fdatasync per transaction, several per group).
The rows reach LMDB later, in one transaction: sealed straight into a run once a seal's worth
waits, or into the level when a call that reads needs them there. That transaction records how
many adds the index holds (the topic record's ``applied``), so a replay applies exactly the adds
after it, once each, whatever the journal repeats.

The files are the engine's journal files (:class:`~bucketstore.engine.durability.journal.Journal`:
CRC-framed groups, one write and one fsync per group, a torn tail cut at replay) holding ``t``
records, one directory per topic id: ``STORE/topics/journal/<topic id, 10 digits>/``. Once the
index is synced with every journaled add in it, a checkpoint (an empty one: the index holds the
state) starts a new file and deletes the older ones.
"""

from __future__ import annotations

import os

import numpy as np

from ...errors import JournalError
from ...format.fs import FileSystem
from ...format.journal_codec import parse_file
from ..durability.journal import FdPool, Journal, list_files, newest_checkpoint

__all__ = ["TopicJournal", "CHECKPOINT_ROWS", "journal_root", "topic_journal_directory", "remove_journals",
           "journal_backlog", "read_topic_journal", "adds_after"]

#: Adds journaled since the last checkpoint past which the topic syncs its index and checkpoints
#: (about 3 MB of journal, read back at an open after a crash).
CHECKPOINT_ROWS = 65_536
_EMPTY = np.zeros(0, dtype=np.uint64)


def journal_root(topics_path: str) -> str:
    return os.path.join(topics_path, "journal")


def topic_journal_directory(topics_path: str, topic_id: int) -> str:
    return os.path.join(journal_root(topics_path), f"{topic_id:010d}")


def remove_journals(topics_path: str, topic_ids: set[int], fs: FileSystem) -> None:
    """Delete the journals of these topics (deleted: call once their deletion is synced)."""
    for tid in sorted(topic_ids):
        directory = topic_journal_directory(topics_path, tid)
        if not os.path.isdir(directory):
            continue
        for name in sorted(os.listdir(directory)):
            fs.unlink(os.path.join(directory, name))
        try:
            os.rmdir(directory)
        except OSError:
            pass  # a file appeared meanwhile: the next open's sweep removes it
        fs.fsync_dir(journal_root(topics_path))


def journal_backlog(topics_path: str, topic_id: int, applied: int) -> int:
    """How many adds the topic's journal holds that its index does not (numbered ``applied``
    and on: what a reopen replays), read without changing anything (a torn tail of the newest
    file is left out, as a replay cuts it).

    :raises JournalError: damage that is not a torn tail, or adds missing before the journal's.
    """
    records = read_topic_journal(topics_path, topic_id)
    return len(adds_after(records, applied, topic_journal_directory(topics_path, topic_id)))


def read_topic_journal(topics_path: str, topic_id: int, attempts: int = 5) -> list[tuple]:
    """The topic's journal's ``t`` records from its newest checkpoint on, read without changing
    anything, beside a live writer too: a torn tail of the newest file is left out (not cut: it
    may be the group being written now), and a file a checkpoint removes while it is read makes
    a new listing ([] when the topic has no journal).

    :raises JournalError: damage that is not a torn tail, or files that keep vanishing.
    """
    directory = topic_journal_directory(topics_path, topic_id)
    for _ in range(attempts):
        files = list_files(directory)[0] if os.path.isdir(directory) else []
        parsed = []
        try:
            for i, (number, path) in enumerate(files):
                with open(path, "rb") as f:
                    parsed.append(parse_file(f.read(), path, number, last=i == len(files) - 1, topic=True).records)
        except FileNotFoundError:
            continue  # a live writer's checkpoint superseded the files listed: list again
        return [rec for records in parsed[newest_checkpoint(parsed):] for rec in records if rec[0] == "t"]
    raise JournalError(directory, 0, f"topic journal files kept vanishing while being read ({attempts} attempts)")


def adds_after(records: list[tuple], applied: int, directory: str) -> list[tuple[int, int, int, int]]:
    """Of the journal's ``t`` records (in order), the adds the index does not hold yet (numbered
    ``applied`` and on), each once, as ``(ledger, entry, deliver_at, cutoff of the call)``.

    :raises JournalError: the records skip adds after the ones the index holds.
    """
    expected = applied
    out: list[tuple[int, int, int, int]] = []
    for _, first, ledgers, entries, ts, cutoffs in records:
        end = first + len(ledgers)
        if end <= expected:
            continue  # in the index already (or repeated by a later group)
        if first > expected:
            raise JournalError(directory, 0, f"topic journal skips adds {expected}..{first - 1}: "
                                             "the adds the index holds end before its first")
        skip = expected - first
        cut = (cutoffs[skip:].astype(np.int64) - 1).tolist()  # stored plus one: -1 (none yet) is 0
        out.extend(zip(ledgers[skip:].tolist(), entries[skip:].tolist(), ts[skip:].tolist(), cut))
        expected = end
    return out


class TopicJournal:
    """The journal of one topic (the topic's lock guards it)."""

    def __init__(self, topics_path: str, topic_id: int, name: str, store_id: str | None, fs: FileSystem,
                 pool: FdPool | None = None) -> None:
        self.directory = topic_journal_directory(topics_path, topic_id)
        self._journal = Journal(self.directory, fs, tracker=name, store_id=store_id, topic=True, pool=pool)
        #: Adds written since the last checkpoint (see :data:`CHECKPOINT_ROWS`), and adds queued.
        self.rows = 0
        self._queued = 0

    def replay(self, applied: int) -> tuple[list[tuple[int, int, int, int]], int]:
        """The journaled adds the index does not hold yet (numbered ``applied`` and on), in
        order, as ``(ledger, entry, deliver_at, cutoff of the call)``; and how many files were
        read. Cuts a torn tail (:meth:`Journal.replay`)."""
        state = self._journal.replay()
        out = adds_after([rec for rec in state.records if rec[0] == "t"], applied, self.directory)
        self.rows = len(out)
        return out, state.files

    def append(self, first: int, rows: list[tuple[int, int, int, int]]) -> None:
        """Queue adds numbered from ``first`` (``(ledger, entry, deliver_at, cutoff)``) for the next commit."""
        if not rows:
            return
        ledgers, entries, ts, cutoffs = zip(*rows)  # positions and times take all 64 bits
        self._journal.add_topic_rows(first, np.array(ledgers, dtype=np.uint64), np.array(entries, dtype=np.uint64),
                                     np.array(ts, dtype=np.uint64),
                                     (np.array(cutoffs, dtype=np.int64) + 1).astype(np.uint64))
        self._queued += len(rows)

    @property
    def has_pending(self) -> bool:
        return self._journal.has_pending

    def commit(self) -> None:
        """Write the queued adds as one group and fsync it (one write, one fsync)."""
        self._journal.commit()
        self.rows, self._queued = self.rows + self._queued, 0

    def discard(self) -> None:
        """Drop the queued adds unwritten: the synced index holds them."""
        self._journal.discard()
        self._queued = 0

    def checkpoint(self) -> None:
        """Start a new file and delete the older ones: call once the index is synced with every
        journaled add in it (the record's ``applied`` counts them)."""
        self._journal.checkpoint(_EMPTY, _EMPTY, _EMPTY, None)
        self.rows = self._queued = 0

    def close(self) -> None:
        self._journal.close()
