"""Kill a real process at each durable step of a topic workload (``tests/crash/test_topic_crash_points.py``).

A topic's rows and subscriptions live in an LMDB environment, whose writes bypass the
:class:`~bucketstore.format.fs.FileSystem` seam that
:class:`~bucketstore.testing.faults.FaultyFileSystem` numbers. :class:`DurableSteps` numbers
both kinds of durable step of one process:

* each commit of a topic write transaction (``topic_commit``, ``topic_seal_commit`` for a
  seal's or a merge's) and each sync of the topic environment (``topic_sync``), through the
  engine's seam
  :data:`bucketstore.engine.topics.topic_file.durable_step_hook`;
* each durable call the store makes through its file layer (``create``, ``open_append``,
  ``write``, ``fsync``, ``truncate``, ``rename``, ``unlink``, ``fsync_dir``: the layer is
  :meth:`DurableSteps.file_system`, handed to the store, which the topics' sealed run files
  go through too) and each catalog commit (``catalog_commit``).

and sends the process SIGKILL just before step ``kill_at``: a killed writer, not a simulated
one (a commit it was about to make is aborted by LMDB; the ones before stay, in the page cache).

:func:`run_ops` forks a child that opens a store, runs a list of calls
(:mod:`bucketstore.testing.topic_model`'s vocabulary) with a :class:`DurableSteps` installed,
and streams back every step and every answer; the parent gets them as a :class:`ChildRun`. A
first run without ``kill_at`` counts the steps N (and kills itself after its last call, so it is
the crash point N); one run per k < N then dies before step k. Only for POSIX (``os.fork``).
"""

from __future__ import annotations

import json
import os
import select
import signal
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import TrackerConfig
from ..engine.topics import topic_file
from ..engine.store.store import Store
from ..engine.topics.topic_reader import verify_topics
from ..format.fs import FileSystem
from .clock import FakeClock
from .topic_model import TopicModel

__all__ = ["DurableSteps", "CountingFileSystem", "ChildRun", "run_ops", "candidates", "check_killed_store", "COMMITS",
           "is_commit"]

#: The steps after which a store's state is what its last call left (the others make it durable).
#: A seal's or a merge's commit (``topic_seal_commit``) is not one: it lists a sealed run and moves
#: rows into it without changing any answer, so the state before and after it is the same.
COMMITS = ("topic_commit", "catalog_commit")


def is_commit(kind: str, target: str) -> bool:
    """Whether a step (once done) makes a call's changes survive a kill: a commit of
    :data:`COMMITS`, or the write of a group into a named topic journal file (a killed process
    keeps what it wrote; its fsync is for a power loss). A checkpoint's ``*.journal.tmp`` file is
    not one: it holds no add, and is named by its rename."""
    return kind in COMMITS or (kind == "write" and target.endswith(".journal"))


class DurableSteps:
    """Numbers this process's durable steps; SIGKILLs the process before step ``kill_at``.

    :param kill_at: the step (0-based) the process dies before; None: never.
    :param on_step: called as ``on_step(k, kind, target)`` before step ``k`` runs (and
        before the kill), e.g. to report it to the parent.
    """

    def __init__(self, kill_at: int | None = None, on_step: Any = None) -> None:
        self.kill_at = kill_at
        self.on_step = on_step
        self.count = 0

    def step(self, kind: str, target: str) -> None:
        k = self.count
        self.count += 1
        if self.on_step is not None:
            self.on_step(k, kind, target)
        if self.kill_at is not None and k >= self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(60)  # the signal is delivered at once; never go on with the step

    def install(self) -> None:
        """Number the topic environments' commits and syncs (process-wide)."""
        topic_file.durable_step_hook = self.step

    def uninstall(self) -> None:
        topic_file.durable_step_hook = None

    def file_system(self) -> "CountingFileSystem":
        """A real file layer that numbers its durable calls here; give it to the store."""
        return CountingFileSystem(self)

    def attach(self, store: Store) -> None:
        """Number the store's catalog commits too."""
        catalog = store.catalog
        catalog.before_commit = lambda: self.step("catalog_commit", catalog.path)


class CountingFileSystem(FileSystem):
    """The real file layer; each durable call is a step of its :class:`DurableSteps` first."""

    def __init__(self, steps: DurableSteps) -> None:
        self._steps = steps
        #: The path each open descriptor was opened with: a write names its file (a journal's
        #: group write is a commit, a run file's is not; see :func:`is_commit`).
        self._paths: dict[int, str] = {}

    def _target(self, fd: int) -> str:
        return self._paths.get(fd, f"fd {fd}")

    def create(self, path: str) -> int:
        self._steps.step("create", path)
        fd = super().create(path)
        self._paths[fd] = path
        return fd

    def open_append(self, path: str) -> int:
        self._steps.step("open_append", path)
        fd = super().open_append(path)
        self._paths[fd] = path
        return fd

    def close(self, fd: int) -> None:
        self._paths.pop(fd, None)
        super().close(fd)

    def rename(self, src: str, dst: str) -> None:
        self._steps.step("rename", f"{src} -> {dst}")
        super().rename(src, dst)
        for fd, path in self._paths.items():
            if path == src:
                self._paths[fd] = dst

    def write(self, fd: int, data: bytes | bytearray | memoryview) -> None:
        self._steps.step("write", self._target(fd))
        super().write(fd, data)

    def fsync(self, fd: int) -> None:
        self._steps.step("fsync", self._target(fd))
        super().fsync(fd)

    def truncate(self, fd: int, length: int) -> None:
        self._steps.step("truncate", self._target(fd))
        super().truncate(fd, length)

    def unlink(self, path: str) -> None:
        self._steps.step("unlink", path)
        super().unlink(path)

    def fsync_dir(self, path: str) -> None:
        self._steps.step("fsync_dir", path)
        super().fsync_dir(path)


@dataclass
class ChildRun:
    """What a child reported before it died.

    ``steps``: ``(kind, target relative to the store, index of the call in flight)`` for each
    step it reached (the one it was killed before included); ``answers``: the answer of each call
    that returned, in order (JSON: positions as lists); ``signal``: what ended it (SIGKILL).
    """

    steps: list[tuple[str, str, int]] = field(default_factory=list)
    answers: list[Any] = field(default_factory=list)
    error: str | None = None
    signal: int | None = None

    @property
    def returned(self) -> int:
        return len(self.answers)


class _Runner:
    """The child's side: the store, the topic, its subscriptions, and the calls."""

    def __init__(self, path: Path, durability: str, sync_interval_ms: int, config: TrackerConfig,
                 steps: DurableSteps, start_ms: int, delivery: str) -> None:
        self.path, self.durability, self.sync_interval_ms, self.config = path, durability, sync_interval_ms, config
        self.delivery = delivery
        self.steps = steps
        self.clock = FakeClock(start_ms)
        self.store: Store | None = None

    def open(self) -> None:
        # confirm_sync_ms=0: a wall-clock window would make the steps differ from run to run.
        self.store = Store(self.path, durability=self.durability, fs=self.steps.file_system(),
                           sync_interval_ms=self.sync_interval_ms, confirm_sync_ms=0, read_ahead=False,
                           delivery=self.delivery)
        self.steps.attach(self.store)
        self.topic = self.store.topic("t", config=self.config, clock=self.clock)
        self.subs = {name: self.topic.subscription(name) for name in self.topic.subscriptions()}

    def run(self, op: tuple[Any, ...]) -> Any:
        kind = op[0]
        if kind == "open":
            self.open()
        elif kind == "restart":
            assert self.store is not None
            self.store.close()
            self.open()
        elif kind == "sub":
            self.subs[op[1]] = self.topic.subscription(op[1], start=op[2])
        elif kind == "delete":
            del self.subs[op[1]]
            self.topic.delete_subscription(op[1])
        elif kind == "advance":
            self.clock.advance(op[1])
        elif kind == "add":
            via = self.topic if op[1] is None else self.subs[op[1]]
            rows = [(lg, en, self.clock.now + dt) for lg, en, dt in op[2]]
            return via.add_message(*rows[0]) if len(rows) == 1 else via.add_messages(rows)
        elif kind == "deliver":
            return [list(p) for p in self.subs[op[1]].get_scheduled_messages(op[2])]
        elif kind == "confirm":
            self.subs[op[1]].confirm_delivered()
        elif kind == "mark":
            self.subs[op[1]].mark_delete(op[2], op[3])
        elif kind == "clear":
            self.subs[op[1]].clear()
        elif kind == "flush":
            (self.topic if op[1] is None else self.subs[op[1]]).flush()
        else:
            raise ValueError(f"unknown call {op!r}")
        return None


def _child(w: int, path: Path, ops: list[tuple[Any, ...]], durability: str, sync_interval_ms: int,
           config: TrackerConfig, kill_at: int | None, start_ms: int, delivery: str) -> None:
    current = [0]
    root = str(path)

    def send(record: dict[str, Any]) -> None:
        data = (json.dumps(record) + "\n").encode()
        while data:
            data = data[os.write(w, data):]

    def report(k: int, kind: str, target: str) -> None:
        send({"step": kind, "target": target.replace(root, "STORE"), "op": current[0]})

    steps = DurableSteps(kill_at, report)
    steps.install()
    runner = _Runner(path, durability, sync_interval_ms, config, steps, start_ms, delivery)
    try:
        for i, op in enumerate(ops):
            current[0] = i
            send({"answer": runner.run(op)})
    except BaseException:  # noqa: BLE001 - reported to the parent, which fails the test
        send({"error": traceback.format_exc()})
        os._exit(1)
    os.kill(os.getpid(), signal.SIGKILL)  # the process dies after its last call, before any close


def run_ops(path: str | os.PathLike[str], ops: list[tuple[Any, ...]], *, durability: str,
            sync_interval_ms: int = 0, config: TrackerConfig, kill_at: int | None = None,
            start_ms: int = 1_000, delivery: str = "at-least-once", timeout: float = 60.0) -> ChildRun:
    """Run ``ops`` (the first one ``("open",)``) on the store at ``path`` (new, or left by an
    earlier run) in a forked child that dies by SIGKILL before durable step ``kill_at`` (None:
    after the last call). Its clock starts at ``start_ms``; ``delivery`` is the store's.

    The store uses ``confirm_sync_ms=0`` and no read-ahead thread, so the steps are the same
    from run to run; use ``sync_interval_ms`` 0 or longer than the run, for the same reason. The
    parent must hold no LMDB environment of the store open across the fork.
    """
    path = Path(path)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child never returns into the caller
        try:
            os.close(r)
            _child(w, path, ops, durability, sync_interval_ms, config, kill_at, start_ms, delivery)
        finally:
            os._exit(2)
    os.close(w)
    run = ChildRun()
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            ready, _, _ = select.select([r], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                os.kill(pid, signal.SIGKILL)
                raise TimeoutError(f"the workload's child ran past {timeout} s (killed)")
            data = os.read(r, 1 << 16)
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(r)
        _, status = os.waitpid(pid, 0)
    for line in b"".join(chunks).decode().splitlines():
        record = json.loads(line)
        if "step" in record:
            run.steps.append((record["step"], record["target"], record["op"]))
        elif "answer" in record:
            run.answers.append(record["answer"])
        else:
            run.error = record["error"]
    run.signal = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
    return run


def candidates(states: list[TopicModel], steps: list[tuple[str, str, int]], k: int) -> list[TopicModel]:
    """The state a process killed before step ``k`` left, as a one-item list.

    ``steps`` are the uncrashed run's (:attr:`ChildRun.steps`). A call commits what it changes
    in its last transaction; a transaction before that one only writes the adds answered
    before the call (those still waiting for a group commit or a seal). So if the last commit
    before ``k`` was made during call ``j``, the store holds the model after call ``j``
    (``states[j + 1]``) if it was call ``j``'s last commit, else before it (``states[j]``);
    with no commit yet, ``states[0]``.
    """
    done = [op for kind, target, op in steps[:k] if is_commit(kind, target)]
    if not done:
        return [states[0]]
    j = done[-1]
    last = sum(1 for kind, target, op in steps if is_commit(kind, target) and op == j)
    return [states[j + 1] if done.count(j) == last else states[j]]


def _recovered(model: TopicModel, now: int) -> TopicModel:
    out = model.copy()
    out.now = now
    out.apply(("restart",))
    return out


def _history_before(history: list[TopicModel], states: list[TopicModel], now: int) -> list[TopicModel]:
    """The run's states up to the latest candidate, latest first, as reopened at ``now``."""
    end = max((i for i, h in enumerate(history) for c in states if h is c), default=len(history) - 1)
    return [_recovered(h, now) for h in reversed(history[:end + 1])]


def _rolled_back(base: TopicModel, got: dict[str, Any], earlier: list[TopicModel]) -> TopicModel | None:
    """``base`` with each subscription it does not match replaced by the latest of its earlier
    states that matches ``got`` (a group-committed delivery not written yet), or None."""
    if set(base.subs) != set(got):
        return None
    out = base.copy()
    for n, want in got.items():
        s = out.subs[n]
        if (s.recoverable, s.count, s.next_time()) == want:
            continue
        found = next((h.subs[n] for h in earlier if n in h.subs
                      and (h.subs[n].recoverable, h.subs[n].count, h.subs[n].next_time()) == want), None)
        if found is None:
            return None
        out.subs[n] = found
    return out


def check_killed_store(path: str | os.PathLike[str], *, durability: str, config: TrackerConfig, now: int,
                       states: list[TopicModel], universe: set[tuple[int, int]], context: str,
                       drain_after_ms: int = 10**7, delivery: str = "at-least-once",
                       history: list[TopicModel] | None = None) -> TopicModel:
    """Reopen a killed store and hold topic ``"t"`` to ``states`` (the candidates); return the one
    it matched, as reopened at ``now`` (before the drain below: the model of the store's next life).

    * ``verify`` finds nothing wrong with the topic index;
    * per subscription, nothing lost (what every candidate brings back is tracked or delivered
      again) and nothing back that none brings back (delivered and confirmed, acknowledged,
      cleared, never added);
    * one candidate matches every subscription at once (the commits are atomic): the same
      subscriptions, and for each the positions it holds (``contains_message``), its count and
      its next delivery time;
    * draining (what is due at ``now``, then everything ``drain_after_ms`` later) delivers what
      that candidate delivers, batch for batch, and leaves every count at 0.

    ``history`` (every state of the run, ``states`` among them) is for group-committed deliveries
    (``sync_interval_ms > 0``): a subscription's deliveries and confirmations wait for a later
    commit, so a kill may leave it as it was some calls before the candidate, each subscription
    at its own call. Then a subscription whose figures no candidate has may match an earlier
    state of the run (the latest that matches is taken); nothing lost and nothing back are still
    judged against the candidates, and the drain against that combination.
    """
    problems = verify_topics(os.fspath(path))
    assert not problems, f"{context}: verify: {problems}"
    recovered = [_recovered(m, now) for m in states]
    earlier = _history_before(history, states, now) if history else []
    clock = FakeClock(now)
    store = Store(path, durability=durability, confirm_sync_ms=0, read_ahead=False, delivery=delivery)
    try:
        topic = store.topic("t", config=config, clock=clock)
        names = set(topic.subscriptions())
        subs = {n: topic.subscription(n) for n in sorted(names)}
        got = {n: ({p for p in universe if s.contains_message(*p)}, s.number_of_delayed_messages,
                   s.next_delivery_time()) for n, s in subs.items()}
        for n, (held, _, _) in got.items():
            theirs = [m.subs[n].recoverable for m in recovered if n in m.subs]
            assert theirs, f"{context}: subscription {n!r} is back, no state around the kill has it"
            # Grouped deliveries and confirmations not written yet come back (never lost).
            maybe = theirs + [m.subs[n].recoverable for m in earlier if n in m.subs]
            lost, back = set.intersection(*theirs) - held, held - set.union(*maybe)
            assert not lost, f"{context}: {n!r} lost {sorted(lost)}"
            assert not back, f"{context}: {n!r} holds {sorted(back)}: delivered and confirmed, acknowledged or never added"
        matching = [m for m in recovered if set(m.subs) == names and all(
            (m.subs[n].recoverable, m.subs[n].count, m.subs[n].next_time()) == got[n] for n in names)]
        if not matching and history:
            matching = [_rolled_back(m, got, earlier) for m in recovered]
            matching = [m for m in matching if m is not None]
        assert matching, (f"{context}: the store matches no state around the kill: got {got}; candidates "
                          + "; ".join(str({n: (sorted(s.recoverable), s.count, s.next_time())
                                           for n, s in m.subs.items()}) for m in recovered))
        expected = []
        for m in matching:
            m = m.copy()  # the state recovered is returned undrained
            first = {n: s.deliver(10**9, m.cutoff) for n, s in m.subs.items()}
            m.now += drain_after_ms
            expected.append((first, {n: s.deliver(10**9, m.cutoff) for n, s in m.subs.items()}))
        first = {n: s.get_scheduled_messages(10**9) for n, s in subs.items()}
        clock.advance(drain_after_ms)
        drained = (first, {n: s.get_scheduled_messages(10**9) for n, s in subs.items()})
        assert drained in expected, f"{context}: drained {drained}, expected one of {expected}"
        for n, s in subs.items():
            assert s.number_of_delayed_messages == 0 and s.next_delivery_time() is None, \
                f"{context}: {n!r} counts {s.number_of_delayed_messages} after draining"
        return matching[0]
    finally:
        store.close()
