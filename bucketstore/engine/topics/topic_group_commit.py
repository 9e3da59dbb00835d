"""Journal mode's adds, as the topic handles them (mixed into :class:`~.topic.Topic`): the group
commit that makes them durable in the topic's journal, their move into the index, and their
replay at open (``docs/topics.md``, "Durability"; the files: :mod:`~.topic_journal`).

Adds are numbered in the order they are answered; the index records how many it holds
(``applied``, written by the transaction that moves them in), so the journal may repeat adds
the index holds: a replay applies each add once, from ``applied`` on.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ...format.topic_codec import decode_subscription, sub_key
from .subscription_state import SubscriptionState
from .topic_file import TopicFile
from .topic_journal import CHECKPOINT_ROWS, TopicJournal, remove_journals, topic_journal_directory

__all__ = ["JournaledAdds", "state_as_written"]


def state_as_written(name: str, raw: bytes) -> SubscriptionState:
    """A subscription's record as written, its batch not confirmed still that (the open's
    :meth:`SubscriptionState.decode` makes it rows to deliver again)."""
    r = decode_subscription(raw)
    return SubscriptionState(name=name, frontier=r["frontier"], mark_delete=r["mark_delete"],
                             start_seq=r["start_seq"], clear_seq=r["clear_seq"], count_base=r["count"],
                             inserted_base=r["inserted_base"], lost={(lg, en): seq for lg, en, seq in r["lost"]},
                             unconfirmed=list(r["unconfirmed"]), redeliver=list(r["redeliver"]))


class JournaledAdds:
    """Mixed into :class:`~.topic.Topic`, which sets the attributes used here."""

    _file: TopicFile
    _id: int
    _pending: list[tuple[int, int, int, int]]
    _pending_limit: int
    _seal_rows: int
    _sync_interval: int
    _unsaved: set[str]
    _behind: bool
    _cutoff: Any
    _runs: Any
    _subs: dict[str, SubscriptionState]
    _states_read: dict[str, bytes]

    def _write(self, room: int = 0, step: str = "topic_commit") -> Any:
        raise NotImplementedError

    def _sync(self) -> None:
        raise NotImplementedError

    def _apply(self) -> None:
        raise NotImplementedError

    def _commit_progress(self) -> None:
        raise NotImplementedError

    def _open_journal(self, durability: str, name: str, store_id: str | None, applied: int,
                      pool: Any = None) -> None:
        """Open the topic's journal (journal mode, or in sealed mode one a journal-mode run left)
        and apply what it holds that the index lacks."""
        states_read, self._states_read = self._states_read, {}
        #: How many adds the index holds: the journal's adds from this one on are in memory only.
        self._applied = applied
        #: Of ``_pending``, how many the journal has queued, and how many it has written.
        self._journaled = self._written = 0
        self._last_group = time.monotonic()
        self._journal: TopicJournal | None = None
        directory = topic_journal_directory(self._file.path, self._id)
        if durability != "journal" and not os.path.isdir(directory):
            return
        #: Its descriptor is one of the store's journals' (a bounded pool).
        journal = TopicJournal(self._file.path, self._id, name, store_id, self._file.fs, pool)
        rows, files = journal.replay(applied)
        if rows:
            self._cutoff.raise_to(max(r[3] for r in rows))  # the cutoff never moves back across a restart
        if durability != "journal":
            # Left by a journal-mode run: its adds were acknowledged. Into the index, synced,
            # then the journal goes (sealed mode appends none).
            self._pending, self._journaled = rows, len(rows)
            self._replay_before_restart(states_read)
            journal.close()
            remove_journals(self._file.path, {self._id}, self._file.fs)
            return
        self._journal = journal
        self._pending_limit = self._seal_rows  # a seal's worth waits, then goes straight into a run
        if rows:
            self._pending = rows
            self._journaled = self._written = len(rows)
            self._replay_before_restart(states_read)
        if rows or files > 1:
            journal.checkpoint()

    def _replay_before_restart(self, states_read: dict[str, bytes]) -> None:
        """Apply the replayed adds (``_pending``) to the subscriptions as they were when the adds
        were answered, before this open made their unconfirmed batches rows to deliver again (a
        re-add of a position of such a batch is judged by it), then restart them as the open
        restarted the others, and sync."""
        self._subs = {name: state_as_written(name, states_read[name]) for name in self._subs}
        self._sync()  # writes the states the adds change, as written
        with self._write() as txn:
            for name, state in list(self._subs.items()):
                restarted = self._subs[name] = SubscriptionState.decode(name, state.encode())
                txn.put(sub_key(self._id, name), restarted.encode(), db=self._file.subs)
        self._sync()

    def _journal_adds(self) -> None:
        """After an add call in journal mode: the group commit when its interval says, and the
        move into the index (a run) once a seal's worth waits."""
        journal = self._journal
        assert journal is not None
        if self._sync_interval == 0 or (time.monotonic() - self._last_group) * 1000 >= self._sync_interval:
            self._group_commit()
        if len(self._pending) >= self._pending_limit:
            self._apply()
            # A merge's old files go once its commit is synced; a long journal once the synced
            # index holds its adds (then a checkpoint starts it afresh).
            if self._runs.dropped or journal.rows >= CHECKPOINT_ROWS:
                self._sync()

    def _group_commit(self) -> None:
        """Append the adds not journaled yet and fsync once. With deliveries or confirmations
        waiting to be written or synced, the index is synced instead (they are promised within
        the same window)."""
        journal = self._journal
        assert journal is not None
        if self._unsaved or self._behind:
            self._sync()
            return
        journal.append(self._applied + self._journaled, self._pending[self._journaled:])
        self._journaled = len(self._pending)
        if journal.has_pending:
            journal.commit()
        self._written = self._journaled
        self._last_group = time.monotonic()

    @contextmanager
    def _applying(self, pending: list[tuple[int, int, int, int]]) -> Iterator[str]:
        """Around the transaction that moves ``pending`` into the index, which counts them as
        held (``applied``; undone if it fails). They join the journal's next group first
        (unwritten yet), so that the group commit that promises them stays one journal fsync.
        Yields the durable step the transaction's commit is (one of adds the journal has written
        changes no answer: ``topic_apply_commit``)."""
        step = "topic_commit"
        if self._journal is not None:
            self._journal.append(self._applied + self._journaled, pending[self._journaled:])
            if self._written == len(pending) and not self._unsaved:
                step = "topic_apply_commit"
        self._journaled = self._written = 0
        before, self._applied = self._applied, self._applied + len(pending)
        try:
            yield step
        except BaseException:
            self._applied = before
            raise

    def _journal_synced(self) -> None:
        """The index is synced with every pending add in it: the journal's queue is redundant,
        and a long journal starts afresh."""
        self._last_group = time.monotonic()
        if self._journal is not None:
            self._journal.discard()
            if self._journal.rows >= CHECKPOINT_ROWS:
                self._journal.checkpoint()

    def _settle(self) -> None:
        """Write the pending adds and the progress not written yet (``TopicFile.settle``: this
        process's readers and copies see what the topic answered, its adds too)."""
        self._apply()
        self._commit_progress()

    def _close_journal(self) -> None:
        """At a clean close (the index synced): leave nothing to replay."""
        if self._journal is not None and self._journal.rows:
            self._journal.checkpoint()

    def _release_journal(self) -> None:
        if self._journal is not None:
            self._journal.close()
