"""The LMDB environment that holds a store's topics (``STORE/topics/``; ``formats/topics.md``).

Apart from the catalog so that a store without topics is unchanged, and because a topic
writes a transaction per call where the catalog writes one per seal. The environment is opened
with ``MDB_NOMETASYNC``: each commit writes and fsyncs its data pages, and the meta page that
makes it current is synced by the next commit or :meth:`TopicFile.sync`. LMDB documents that
this keeps the file intact on a power loss, which may undo the last transaction; the topics
call :meth:`TopicFile.sync` where their durability mode promises (every call in ``journal``
mode with ``sync_interval_ms=0``, at group-commit points otherwise, always at ``flush`` and
``close``). A killed process loses nothing committed.

All topics of a store share the environment and :attr:`TopicFile.lock`: one transaction at a
time, which also makes the map's growth (which needs no transaction running) safe.
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import lmdb

from ...errors import CatalogError
from ...format.fs import REAL_FS, FileSystem
from ...format.topic_codec import TOPICS_FORMAT, U64, TopicRecordError, decode_topic
from ..catalog.lmdb_file import check_data_file
from .topic_rows import RowTables
from .topic_journal import journal_root, remove_journals
from .topic_runs import runs_directory
from .topic_windows import WindowBudget

__all__ = ["TopicFile", "topics_directory", "live_topic_file", "copy_topics"]

#: The topic environments this process has open for writing, by real path: LMDB refuses a
#: second open of one environment in a process, so a reader here borrows the writer's.
_WRITERS: dict[str, "TopicFile"] = {}
_WRITERS_LOCK = threading.Lock()


def live_topic_file(store_path: str) -> "TopicFile | None":
    """The store's topic environment if this process has it open for writing."""
    with _WRITERS_LOCK:
        return _WRITERS.get(os.path.realpath(topics_directory(store_path)))


#: A testing seam, None in production: when set, called as ``hook(kind, path)`` just before each
#: durable step of a topic environment, ``"topic_commit"`` (a write transaction is about to
#: commit: a hook that kills the process leaves it uncommitted), ``"topic_seal_commit"`` (the
#: commit of a seal, which lists a new run and moves its rows out of the tables: it changes no
#: answer), ``"topic_apply_commit"`` (the commit of adds a topic's journal holds already, which
#: moves them into the index: it changes no answer either) or ``"topic_sync"`` (an fsync). A
#: topic journal's steps (engine/topics/topic_journal.py) go through the store's ``FileSystem``. A run file's own steps (create, write, fsync, rename,
#: directory fsync, unlink) go through the store's ``FileSystem``.
#: LMDB writes its own files, outside the ``FileSystem`` seam a crash test numbers, so this is
#: how :mod:`bucketstore.testing.topic_crash` numbers the topics' durable steps and kills a
#: process before any one of them. Process-wide: it is meant for a forked test child.
durable_step_hook: Callable[[str, str], None] | None = None


def _step(kind: str, path: str) -> None:
    hook = durable_step_hook
    if hook is not None:
        hook(kind, path)


_INITIAL_MAP = 64 << 20
#: The environment's named tables: topics, subs, rows, positions, multi, meta, runs, dead.
MAX_DBS = 10
_FORMAT_KEY, _NEXT_ID_KEY = b"format", b"next_topic_id"


def _topic_id(record: bytes) -> int:
    try:
        return int(decode_topic(record)["id"])
    except TopicRecordError:
        return -1  # verify reports it; its files are kept


def topics_directory(store_path: str) -> str:
    return os.path.join(store_path, "topics")


def copy_topics(store_path: str, dest_store: str) -> bool:
    """Copy the store's topic index into ``dest_store/topics/`` as one consistent state (LMDB's
    copy runs in one read transaction), beside a live writer too; False when there is none.

    The topics name no ledger or journal file, so any moment of the copy is consistent with
    the rest of a checkpoint.

    Not a compacting copy (the catalog's is): with the ``dupfixed`` tables here, LMDB 0.9.36's
    compacting copy (as python-lmdb 3.0 bundles it) kills the process with SIGSEGV once a table
    spans a few pages (seen at 1,000 keys of 10 values). So the copy keeps the free pages a bulk
    delete left (``stats`` shows them: ``file_bytes`` against ``live_bytes``).
    """
    dest = topics_directory(dest_store)
    live = live_topic_file(store_path)
    if live is not None:
        os.mkdir(dest)
        with live.lock:
            live.settle()
            try:
                live._live().copy(dest)
            except lmdb.Error as exc:
                raise CatalogError(f"{live.path}: copying the topic index failed: {exc}", path=live.path) from None
            _copy_runs(live.runs_path, runs_directory(dest))
        return True
    source = topics_directory(store_path)
    data = os.path.join(source, "data.mdb")
    if not os.path.isfile(data):
        return False
    check_data_file(data)
    os.mkdir(dest)
    _copy_journals(journal_root(source), journal_root(dest))  # adds no transaction holds yet
    try:
        env = lmdb.open(source, readonly=True, max_dbs=MAX_DBS, subdir=True, create=False)
        try:
            env.copy(dest)
        finally:
            env.close()
    except lmdb.Error as exc:
        raise CatalogError(f"{source}: copying the topic index failed: {exc}", path=source) from None
    _copy_runs(runs_directory(source), runs_directory(dest))
    return True


def _copy_journals(source: str, dest: str) -> None:
    """Copy the topics' journals (of a store no process writes: a live writer settles its adds
    into the index before the copy, which then needs none)."""
    if not os.path.isdir(source):
        return
    for topic in sorted(os.listdir(source)):
        src = os.path.join(source, topic)
        if not os.path.isdir(src):
            continue
        os.makedirs(os.path.join(dest, topic))
        for name in sorted(os.listdir(src)):
            if name.endswith(".journal"):
                shutil.copyfile(os.path.join(src, name), os.path.join(dest, topic, name))


def _copy_runs(source: str, dest: str) -> None:
    """Copy the sealed runs beside the copied index: linked where the file system allows (a run
    never changes), else copied. Files no entry names (a seal cut short) are removed at open."""
    if not os.path.isdir(source):
        return
    os.mkdir(dest)
    for name in sorted(os.listdir(source)):
        if not name.endswith(".run"):
            continue
        src, dst = os.path.join(source, name), os.path.join(dest, name)
        try:
            os.link(src, dst)
        except OSError:
            shutil.copyfile(src, dst)


class TopicFile:
    """One store's topic environment, opened for writing (the store holds the write lock)."""

    def __init__(self, store_path: str, fs: FileSystem = REAL_FS) -> None:
        self.path = topics_directory(store_path)
        #: Where the topics' sealed runs are (engine/topics/topic_runs.py), written through ``fs``.
        self.runs_path = runs_directory(self.path)
        self.fs = fs
        self.lock = threading.RLock()
        #: The decoded windows of rows of every topic (engine/topics/topic_windows.py), one budget.
        self.windows = WindowBudget()
        #: Per open topic, the call that writes its subscriptions' progress not written yet.
        self._settlers: dict[int, Callable[[], None]] = {}
        self._written = 1 << 62  # look at the first write
        self._map_size = _INITIAL_MAP
        os.makedirs(self.path, exist_ok=True)
        data = os.path.join(self.path, "data.mdb")
        if os.path.exists(data) and os.path.getsize(data) > 0:
            check_data_file(data)  # a truncated file would kill the process with SIGBUS once mapped
        try:
            self._env = lmdb.open(self.path, map_size=_INITIAL_MAP, max_dbs=MAX_DBS, subdir=True, metasync=False)
            self.topics = self._env.open_db(b"topics")
            self.subs = self._env.open_db(b"subs")
            self.rows = self._env.open_db(b"rows", dupsort=True, dupfixed=True)
            self.positions = self._env.open_db(b"positions", dupsort=True, dupfixed=True)
            self.tables = RowTables(self.rows, self.positions)
            self.multi = self._env.open_db(b"multi")
            self.meta = self._env.open_db(b"meta")
            self.runs = self._env.open_db(b"runs")
            self.dead = self._env.open_db(b"dead")
            self._env.reader_check()
            with self._env.begin(write=True) as txn:
                fmt = txn.get(_FORMAT_KEY, db=self.meta)
                if fmt is None:
                    txn.put(_FORMAT_KEY, TOPICS_FORMAT, db=self.meta)
                elif fmt != TOPICS_FORMAT:
                    raise CatalogError(f"{self.path}: topic index format {fmt!r} is not supported", path=self.path)
                _step("topic_commit", self.path)
            _step("topic_sync", self.path)
            self._env.sync(True)
        except lmdb.Error as exc:
            self.close()
            raise CatalogError(f"{self.path}: cannot open the topic index: {exc}", path=self.path) from None
        with _WRITERS_LOCK:
            _WRITERS[os.path.realpath(self.path)] = self
        self._remove_unowned_runs()

    def _remove_unowned_runs(self) -> None:
        """Unlink the run files and journals of topics the index no longer has (a deletion
        killed after its commit, before its unlinks); each topic removes its own run files no
        entry names at open."""
        journals = journal_root(self.path)
        if os.path.isdir(journals):
            with self.read() as txn:
                with txn.cursor(db=self.topics) as cur:
                    live = {_topic_id(value) for value in cur.iternext(keys=False)}
            gone = {int(name) for name in os.listdir(journals) if name.isdigit() and int(name) not in live}
            if gone and -1 not in live:  # a record that does not decode: whose it is, verify says
                remove_journals(self.path, gone, self.fs)
        if not os.path.isdir(self.runs_path):
            return
        with self.read() as txn:
            owners = {int.from_bytes(key[:4], "big") for key in txn.cursor(db=self.runs).iternext(values=False)}
            with txn.cursor(db=self.topics) as cur:
                live = {_topic_id(value) for value in cur.iternext(keys=False)}
        found = set()
        for name in os.listdir(self.runs_path):
            head = name.split("-", 1)[0]
            if head.isdigit() and int(head) not in live and int(head) not in owners:
                found.add(int(head))
        if found:
            self.remove_runs_of(found)

    def remove_runs_of(self, topic_ids: set[int]) -> None:
        """Unlink every run file of these topics (deleted: call once their deletion is synced)."""
        if not os.path.isdir(self.runs_path):
            return
        prefixes = tuple(f"{tid:010d}-" for tid in topic_ids)
        gone = [name for name in os.listdir(self.runs_path) if name.startswith(prefixes)]
        for name in gone:
            self.fs.unlink(os.path.join(self.runs_path, name))
        if gone:
            self.fs.fsync_dir(self.runs_path)

    def add_settler(self, key: int, settle: Callable[[], None] | None) -> None:
        """Register (or with None, drop) an open topic's writer of deferred progress."""
        with self.lock:
            if settle is None:
                self._settlers.pop(key, None)
            else:
                self._settlers[key] = settle

    def settle(self) -> None:
        """Write what the open topics hold in memory only (deliveries and confirmations in
        their group-commit window), so that this process's readers and copies see what its
        subscriptions see. Committed, not synced."""
        with self.lock:
            for settle in list(self._settlers.values()):
                settle()

    def _live(self) -> lmdb.Environment:
        env = getattr(self, "_env", None)
        if env is None:
            raise CatalogError(f"{self.path}: the topic index is closed", path=self.path)
        return env

    @contextmanager
    def read(self) -> Iterator[lmdb.Transaction]:
        with self.lock:
            try:
                with self._live().begin(buffers=False) as txn:
                    yield txn
            except lmdb.Error as exc:
                raise CatalogError(f"{self.path}: topic index read failed: {exc}", path=self.path) from None

    @contextmanager
    def write(self, room: int = 0, step: str = "topic_commit") -> Iterator[lmdb.Transaction]:
        """A write transaction, committed when the block ends without raising.

        :param room: bytes the transaction may add: the map grows first if they might not
            fit, because a full map aborts the transaction after the caller's state changed.
        :param step: the durable step its commit is to :data:`durable_step_hook`:
            ``"topic_seal_commit"`` for a seal's, which moves rows without changing what any
            subscription sees.
        """
        with self.lock:
            env = self._live()
            # Look at the map's fill once the transactions since the last look may have
            # written an eighth of it (each counted as its room plus 64 KB of copied pages):
            # half of the map is kept free, so the look is seldom and never too late.
            self._written += room + (64 << 10)
            if self._written * 8 > self._map_size:
                self._written = 0
                info, stat = env.info(), env.stat()
                used = (info["last_pgno"] + 1) * stat["psize"]
                if (used + 2 * room) * 2 > info["map_size"]:
                    env.set_mapsize(max(info["map_size"] * 2, (used + 2 * room) * 2))
                self._map_size = env.info()["map_size"]
            try:
                with env.begin(write=True) as txn:
                    yield txn
                    _step(step, self.path)
            except lmdb.Error as exc:
                raise CatalogError(f"{self.path}: topic index write failed: {exc}", path=self.path) from None

    def next_topic_id(self, txn: lmdb.Transaction) -> int:
        raw = txn.get(_NEXT_ID_KEY, db=self.meta)
        value = 0 if raw is None else U64.unpack(raw)[0]
        txn.put(_NEXT_ID_KEY, U64.pack(value + 1), db=self.meta)
        return value

    def sync(self) -> None:
        """Make every committed transaction durable (fsync)."""
        with self.lock:
            try:
                env = self._live()
                _step("topic_sync", self.path)
                env.sync(True)
            except lmdb.Error as exc:
                raise CatalogError(f"{self.path}: topic index sync failed: {exc}", path=self.path) from None

    def size_bytes(self) -> int:
        """The bytes the environment's pages occupy (what the topics cost on disk)."""
        with self.lock:
            env = self._live()
            return (env.info()["last_pgno"] + 1) * env.stat()["psize"]

    def _release(self) -> lmdb.Environment | None:
        """Stop being this process's writer of the file; the environment, now ours alone to
        close (call holding :attr:`lock`), or None if it was released already."""
        with _WRITERS_LOCK:
            if _WRITERS.get(os.path.realpath(self.path)) is self:
                del _WRITERS[os.path.realpath(self.path)]
        env, self._env = getattr(self, "_env", None), None
        return env

    def abandon(self) -> None:
        """Release the environment as a killed process does: no sync, nothing more written
        (:func:`bucketstore.testing.faults.abandon_store`). Its topics' handles are left
        unusable: any call raises :class:`~bucketstore.CatalogError`."""
        with self.lock:
            env = self._release()
            if env is not None:
                env.close()

    def close(self) -> None:
        with self.lock:
            env = self._release()
            if env is not None:
                try:
                    _step("topic_sync", self.path)
                    env.sync(True)
                except lmdb.Error as exc:
                    raise CatalogError(f"{self.path}: topic index sync at close failed: {exc}",
                                       path=self.path) from None
                finally:
                    env.close()
