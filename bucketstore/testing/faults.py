"""Fault injection for the crash-recovery tests: a file layer that fails, crashes and forgets.

:class:`FaultyFileSystem` is a :class:`~bucketstore.format.fs.FileSystem` that performs
every call for real (real files, real ``fsync``) and, beside that, keeps a model
of what a power loss would leave on disk, in the manner of ALICE (Pillai et al.,
OSDI 2014):

* per file, the bytes as written and the bytes as of its last successful
  ``fsync`` (the *durable* content);
* per directory, its entries as they are now and as of its last ``fsync_dir``
  (the *durable* entries): a ``create``, ``rename`` or ``unlink`` that no
  directory fsync has followed may not have happened.

Reads (``open_read``, ``read``: the engine's reads of ledger files) are numbered too, on a
counter of their own (:attr:`FaultyFileSystem.reads`), and can fail (:meth:`FaultyFileSystem.fail_reads`)
but never crash: a read changes nothing durable, and numbering them apart leaves the durable
calls' numbers, which crash enumeration relies on, as they were.

Every durable call is numbered (``create``, ``open_append``, ``write``,
``fsync``, ``truncate``, ``rename``, ``unlink``, ``fsync_dir``, and the
``catalog_commit`` pseudo-call that :meth:`FaultyFileSystem.attach` installs in
:attr:`Catalog.before_commit <bucketstore.engine.catalog.catalog.Catalog.before_commit>`), so a
test can run a workload once to count its calls and then crash it before each
one in turn. A crash raises :class:`SimulatedCrash`, a :class:`BaseException`,
so the engine's ``except Exception`` / ``except OSError`` handlers cannot
swallow it; from then on every call raises it again (a dead process does
nothing more). :meth:`FaultyFileSystem.materialize` then rewrites the modelled
directories as the chosen :class:`Damage` says a crash could leave them, and the
test reopens the store with the real file layer.

The LMDB catalog is not under this layer: LMDB writes and syncs its own files.
A crash at a ``catalog_commit`` call raises inside the write transaction, which
LMDB then aborts, so the transaction did not commit; crashing before the
*next* call models "committed, then crashed". Enumerating every call covers both.

What the model assumes, stated once: files are written sequentially (append
only), as the ledger writer and a journal do; directories themselves (made by
:meth:`~bucketstore.format.fs.FileSystem.makedirs`, which fsyncs the parent at once)
are never lost; a file that existed when its directory was first touched was
durable then.
"""

from __future__ import annotations

import enum
import errno
import os
import random
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

import lmdb

from ..engine.catalog.catalog import Catalog
from ..engine.threads.worker_thread import WorkerThread
from ..format.fs import FileSystem

__all__ = [
    "SimulatedCrash",
    "DataLoss",
    "DirLoss",
    "Damage",
    "ALL_SURVIVES",
    "ONLY_SYNCED",
    "TORN_TAILS",
    "ZEROED_TAILS",
    "DIRS_UNDONE",
    "TORN_AND_UNDONE",
    "DAMAGES",
    "SURVIVABLE_DAMAGES",
    "OPERATIONS",
    "READ_OPERATIONS",
    "FaultRule",
    "FaultyFileSystem",
    "abandon_store",
]

#: The calls that are numbered and can fail or crash.
OPERATIONS = ("create", "open_append", "write", "fsync", "truncate", "rename", "unlink", "fsync_dir",
              "catalog_commit")
#: The read calls, numbered apart (see the module's docstring); they can fail, not crash.
READ_OPERATIONS = ("open_read", "read")


class SimulatedCrash(BaseException):
    """The simulated process died here. Derives from BaseException on purpose: the
    engine's error handlers must not be able to catch a crash and carry on."""


class DataLoss(enum.Enum):
    """What a crash does to the bytes written to a file after its last fsync."""

    KEEP = "keep"      #: they all reached the disk
    SYNCED = "synced"  #: none did: the file is as of its last fsync
    TORN = "torn"      #: a prefix of them did, cut at a random byte
    ZEROED = "zeroed"  #: the size grew but the data blocks were never written: zeros


class DirLoss(enum.Enum):
    """What a crash does to directory operations made after the directory's last fsync."""

    KEEP = "keep"  #: creates, renames and unlinks all persisted
    UNDO = "undo"  #: none did: the directory is as of its last fsync_dir


@dataclass(frozen=True, slots=True)
class Damage:
    """One way a crash can leave the disk: a data-loss mode and a directory-loss mode."""

    name: str
    data: DataLoss
    dirs: DirLoss

    def __str__(self) -> str:
        return self.name


ALL_SURVIVES = Damage("all-survives", DataLoss.KEEP, DirLoss.KEEP)
ONLY_SYNCED = Damage("only-synced", DataLoss.SYNCED, DirLoss.UNDO)
TORN_TAILS = Damage("torn-tails", DataLoss.TORN, DirLoss.KEEP)
ZEROED_TAILS = Damage("zeroed-tails", DataLoss.ZEROED, DirLoss.KEEP)
DIRS_UNDONE = Damage("dirs-undone", DataLoss.KEEP, DirLoss.UNDO)
TORN_AND_UNDONE = Damage("torn+dirs-undone", DataLoss.TORN, DirLoss.UNDO)

#: Every damage mode. They lose only what was never made durable, so the engine,
#: which commits a catalog key only after the file and its directory entry are
#: synced, must recover from each of them.
DAMAGES = (ALL_SURVIVES, ONLY_SYNCED, TORN_TAILS, ZEROED_TAILS, DIRS_UNDONE, TORN_AND_UNDONE)
SURVIVABLE_DAMAGES = DAMAGES


@dataclass(slots=True)
class FaultRule:
    """Fail matching calls with an ``OSError``.

    :ivar errno_: the error number (``errno.EIO``, ``errno.ENOSPC``, ...).
    :ivar ops: the call kinds it applies to (None: all of :data:`OPERATIONS`).
    :ivar first_call: the first call number it may fire at.
    :ivar times: how many calls it fails (None: every matching call, forever).
    :ivar short: for ``write``: write the first half of the data for real, then
        fail (what a disk that fills up mid-write does).
    """

    errno_: int = errno.EIO
    ops: frozenset[str] | None = None
    first_call: int = 0
    times: int | None = 1
    short: bool = False
    fired: int = 0

    def matches(self, call: int, op: str) -> bool:
        return (call >= self.first_call and (self.ops is None or op in self.ops)
                and (self.times is None or self.fired < self.times))


@dataclass(slots=True, eq=False)
class _File:
    """One file object (an inode): its bytes as written, and as of its last fsync.

    ``data is None`` means the file existed before the model saw it and has not
    been touched since: its on-disk content is authoritative and durable.
    """

    data: bytearray | None
    durable: bytes | None
    poisoned: bool = False


@dataclass(slots=True)
class _Dir:
    current: dict[str, _File] = field(default_factory=dict)
    durable: dict[str, _File] = field(default_factory=dict)
    known: set[str] = field(default_factory=set)  # every name the model has seen here


class FaultyFileSystem(FileSystem):
    """A real file layer that counts calls, injects errors and crashes, and models crash damage.

    :param crash_at: crash before call number ``crash_at`` (0-based), if given.

    Typical use::

        fs = FaultyFileSystem(crash_at=17)
        store = bucketstore.Store(path, fs=fs); fs.attach(store.catalog)
        try:
            run_workload(store)
        except SimulatedCrash:
            pass
        abandon_store(store)
        fs.materialize(TORN_TAILS, random.Random(17))
        bucketstore.open(path)   # recovery, with the real file layer
    """

    def __init__(self, *, crash_at: int | None = None) -> None:
        self.calls = 0
        self.log: list[tuple[str, str]] = []
        self.crash_at = crash_at
        self.crashed = False
        self.rules: list[FaultRule] = []
        #: Read calls so far (the read-ahead thread reads too: counted under a lock).
        self.reads = 0
        self.read_log: list[tuple[str, str]] = []
        self.read_rules: list[FaultRule] = []
        self._read_lock = threading.Lock()
        self._read_paths: dict[int, str] = {}  # a reader's fd -> its path (for messages; fds are reused)
        #: Paths the engine fsynced again after an fsync of the same file had failed.
        self.fsync_retries: list[str] = []
        self._dirs: dict[str, _Dir] = {}
        self._fds: dict[int, tuple[_File, str]] = {}

    # -- configuring -----------------------------------------------------------------------------
    def fail(self, err: int = errno.EIO, *, ops: Iterable[str] | None = None, first_call: int | None = None,
             times: int | None = 1, short: bool = False) -> FaultRule:
        """Fail the next ``times`` calls of kinds ``ops`` (all kinds when None) from
        ``first_call`` on (default: the next call) with ``OSError(err)``; ``times=None``
        fails them forever. Returns the rule (its ``fired`` counts how often it fired)."""
        kinds = frozenset(ops) if ops is not None else None
        if kinds is not None and not kinds <= set(OPERATIONS):
            raise ValueError(f"unknown operations {sorted(kinds - set(OPERATIONS))}")
        rule = FaultRule(err, kinds, self.calls if first_call is None else first_call, times, short)
        self.rules.append(rule)
        return rule

    def fail_reads(self, err: int = errno.EIO, *, ops: Iterable[str] | None = None, first_read: int | None = None,
                   times: int | None = 1) -> FaultRule:
        """Fail the next ``times`` read calls of kinds ``ops`` (of :data:`READ_OPERATIONS`; all
        when None) from read number ``first_read`` on (default: the next read) with
        ``OSError(err)`` (``EMFILE`` on every open, ``EIO`` on a read, ...); ``times=None`` fails
        them until :meth:`heal`. Returns the rule (its ``fired`` counts how often it fired)."""
        kinds = frozenset(ops) if ops is not None else None
        if kinds is not None and not kinds <= set(READ_OPERATIONS):
            raise ValueError(f"unknown read operations {sorted(kinds - set(READ_OPERATIONS))}")
        with self._read_lock:
            rule = FaultRule(err, kinds, self.reads if first_read is None else first_read, times)
            self.read_rules.append(rule)
        return rule

    def heal(self) -> None:
        """The fault clears: drop every rule, of durable calls and of reads (a crash stays)."""
        with self._read_lock:
            self.rules = []
            self.read_rules = []

    def attach(self, catalog: "Catalog") -> None:
        """Number the catalog's commits as ``catalog_commit`` calls.

        A crash there raises inside the write transaction, which LMDB aborts. An
        injected error is raised as :class:`lmdb.DiskError`, the way LMDB reports
        a failed write, so the catalog turns it into a ``CatalogError``.
        """
        catalog.before_commit = lambda: self._call("catalog_commit", catalog.path, lmdb_error=True)

    # -- the numbered calls ----------------------------------------------------------------------
    def _call(self, op: str, target: str, *, lmdb_error: bool = False) -> FaultRule | None:
        """Count one call; crash or raise if a fault is due. Returns a ``short`` write rule to apply."""
        if self.crashed:
            raise SimulatedCrash(f"the process already crashed; {op} {target} never runs")
        k = self.calls
        self.calls += 1
        self.log.append((op, target))
        if self.crash_at is not None and k >= self.crash_at:
            self.crash()
            raise SimulatedCrash(f"crash before call {k}: {op} {target}")
        for rule in self.rules:
            if rule.matches(k, op):
                rule.fired += 1
                if rule.short and op == "write":
                    return rule
                message = f"injected {errno.errorcode.get(rule.errno_, rule.errno_)} at call {k}: {op} {target}"
                if lmdb_error:
                    raise lmdb.DiskError(message)
                raise OSError(rule.errno_, os.strerror(rule.errno_) + f" ({message})", target)
        return None

    def _read_call(self, op: str, target: str) -> None:
        """Count one read call; raise if a read fault is due (never a crash: see the docstring)."""
        with self._read_lock:
            k = self.reads
            self.reads += 1
            self.read_log.append((op, target))
            for rule in self.read_rules:
                if rule.matches(k, op):
                    rule.fired += 1
                    message = f"injected {errno.errorcode.get(rule.errno_, rule.errno_)} at read {k}: {op} {target}"
                    raise OSError(rule.errno_, os.strerror(rule.errno_) + f" ({message})", target)

    def crash(self) -> None:
        """Die now: close every descriptor (as the kernel does) and refuse all later calls."""
        self.crashed = True
        for fd in list(self._fds):
            try:
                os.close(fd)
            except OSError:
                pass
        self._fds.clear()

    # -- the model -------------------------------------------------------------------------------
    def _dir(self, directory: str) -> _Dir:
        d = self._dirs.get(directory)
        if d is None:
            # First sight: what is here now is taken as durable (the test starts
            # from a clean directory, a clean close or a materialized crash).
            d = _Dir()
            with os.scandir(directory) as it:
                for entry in it:
                    if entry.is_file(follow_symlinks=False):
                        f = _File(None, None)
                        d.current[entry.name] = d.durable[entry.name] = f
                        d.known.add(entry.name)
            self._dirs[directory] = d
        return d

    @staticmethod
    def _split(path: str) -> tuple[str, str]:
        path = os.path.abspath(path)
        return os.path.dirname(path), os.path.basename(path)

    @staticmethod
    def _load(f: _File, path: str) -> None:
        """Read a pre-existing file's content into the model before the engine changes it."""
        if f.data is None:
            with open(path, "rb") as fh:
                content = fh.read()
            f.data = bytearray(content)
            f.durable = content

    # -- FileSystem overrides --------------------------------------------------------------------
    def create(self, path: str) -> int:
        self._call("create", path)
        fd = super().create(path)
        directory, name = self._split(path)
        d = self._dir(directory)
        f = _File(bytearray(), b"")
        d.current[name] = f
        d.known.add(name)
        self._fds[fd] = (f, path)
        return fd

    def open_append(self, path: str) -> int:
        self._call("open_append", path)
        directory, name = self._split(path)
        d = self._dir(directory)
        f = d.current.get(name)
        if f is not None:
            self._load(f, path)
        fd = super().open_append(path)
        if f is None:
            f = _File(bytearray(), b"")
            d.current[name] = f
            d.known.add(name)
        self._fds[fd] = (f, path)
        return fd

    def write(self, fd: int, data: bytes | bytearray | memoryview) -> None:
        f, path = self._fds[fd]
        short = self._call("write", path)
        data = bytes(data)
        if short is not None:
            part = data[:len(data) // 2]
            super().write(fd, part)
            assert f.data is not None
            f.data += part
            raise OSError(short.errno_, os.strerror(short.errno_) + " (injected after a short write)", path)
        super().write(fd, data)
        assert f.data is not None
        f.data += data

    def fsync(self, fd: int) -> None:
        f, path = self._fds[fd]
        if f.poisoned:
            # After a failed fsync the kernel may have dropped the dirty pages and
            # marked them clean: a second fsync "succeeds" with the data gone.
            # Model exactly that, and record that the engine fell for it.
            self.fsync_retries.append(path)
            self._call("fsync", path)
            return
        try:
            self._call("fsync", path)
        except OSError:
            f.poisoned = True
            raise
        super().fsync(fd)
        assert f.data is not None
        f.durable = bytes(f.data)

    def truncate(self, fd: int, length: int) -> None:
        f, path = self._fds[fd]
        self._call("truncate", path)
        super().truncate(fd, length)
        assert f.data is not None
        del f.data[length:]
        f.data.extend(bytes(length - len(f.data)))

    def close(self, fd: int) -> None:
        # Not numbered: closing makes nothing durable. After a crash the kernel
        # has already closed every descriptor.
        if self.crashed:
            raise SimulatedCrash("the process already crashed; close never runs")
        self._fds.pop(fd, None)
        super().close(fd)

    def open_read(self, path: str) -> int:
        self._read_call("open_read", path)
        fd = super().open_read(path)
        self._read_paths[fd] = path
        return fd

    def pread(self, fd: int, length: int, offset: int) -> bytes:
        self._read_call("read", self._read_paths.get(fd, f"fd {fd}"))
        return super().pread(fd, length, offset)

    def rename(self, src: str, dst: str) -> None:
        self._call("rename", f"{src} -> {dst}")
        sdir, sname = self._split(src)
        ddir, dname = self._split(dst)
        s, d = self._dir(sdir), self._dir(ddir)
        f = s.current.get(sname)
        if f is not None:
            self._load(f, src)
        super().rename(src, dst)
        if f is not None:
            del s.current[sname]
            d.current[dname] = f
            d.known.add(dname)

    def unlink(self, path: str) -> None:
        self._call("unlink", path)
        directory, name = self._split(path)
        d = self._dir(directory)
        f = d.current.get(name)
        if f is not None:
            # Keep the content: undoing the unlink (DirLoss.UNDO) brings the file back.
            self._load(f, path)
        super().unlink(path)
        d.current.pop(name, None)

    def fsync_dir(self, path: str) -> None:
        self._call("fsync_dir", path)
        super().fsync_dir(path)
        d = self._dir(os.path.abspath(path))
        d.durable = dict(d.current)

    # -- after the crash -------------------------------------------------------------------------
    def _image(self, f: _File, mode: DataLoss, rng: random.Random) -> bytes | None:
        """The bytes a crash leaves in file ``f``; None when it is untouched (leave the disk alone)."""
        if f.data is None:
            return None
        data, durable = bytes(f.data), f.durable or b""
        if mode is DataLoss.KEEP or data == durable:
            return data
        if mode is DataLoss.SYNCED or not data.startswith(durable):
            # A truncate or rewrite since the fsync: the safe image is the synced one.
            return durable
        tail = len(data) - len(durable)
        if mode is DataLoss.TORN:
            return data[:len(durable) + rng.randint(0, tail - 1)]
        return durable + bytes(tail)

    def _final_dirs(self, damage: Damage, relocate: tuple[str, str] | None
                    ) -> list[tuple[str, _Dir, dict[str, _File]]]:
        out = []
        for directory, d in sorted(self._dirs.items()):
            if relocate is not None:
                src, dst = (os.path.abspath(p) for p in relocate)
                if directory != src and not directory.startswith(src + os.sep):
                    continue  # outside the copied tree: nothing to rewrite there
                directory = dst + directory[len(src):]
            out.append((directory, d, d.durable if damage.dirs is DirLoss.UNDO else d.current))
        return out

    def materialize(self, damage: Damage, rng: random.Random, *,
                    relocate: tuple[str, str] | None = None) -> list[str]:
        """Rewrite every modelled directory as a crash with ``damage`` could leave it.

        Call after the crash and after :func:`abandon_store` (nothing may hold the
        files open). Only names the model has seen are touched. With ``relocate=
        (src, dst)`` the damage is applied to a copy of the tree ``src`` made at
        ``dst`` (so one crashed run can be damaged in several ways), and
        directories outside ``src`` are left alone. Returns a short description
        of each change, for failure messages.
        """
        if not self.crashed:
            self.crash()
        changes: list[str] = []
        for directory, d, final in self._final_dirs(damage, relocate):
            for name in sorted(d.known):
                path = os.path.join(directory, name)
                f = final.get(name)
                on_disk = os.path.isfile(path)
                if f is None:
                    if on_disk:
                        os.unlink(path)
                        changes.append(f"{name}: gone")
                    continue
                image = self._image(f, damage.data, rng)
                if image is None:
                    continue  # untouched since the model first saw it
                if on_disk:
                    with open(path, "rb") as fh:
                        if fh.read() == image:
                            continue
                with open(path, "wb") as fh:
                    fh.write(image)
                changes.append(f"{name}: {len(image)} bytes")
        return changes

    def state_signature(self, damage: Damage, rng: random.Random, root: str
                        ) -> tuple[tuple[str, str, bytes | None], ...]:
        """What :meth:`materialize` would leave under ``root``, as a comparable value
        (to skip damage modes that leave the same disk as one already tried)."""
        out = []
        for directory, d, final in self._final_dirs(damage, (root, root)):
            for name in sorted(final):
                out.append((os.path.relpath(directory, root), name, self._image(final[name], damage.data, rng)))
        return tuple(out)


def abandon_store(store: object) -> None:
    """Release what the kernel releases when a process dies: the store's LMDB
    environment and its lock descriptor. Runs no engine code (a crashed process
    runs none), so nothing is flushed, deleted or committed."""
    # A dead process has no threads. The store's worker and reader threads are stopped first,
    # their queued items dropped (an item in flight runs into the crashed file layer at its
    # next call, so nothing more becomes durable), so that no thread of the dead store goes on
    # running its jobs beside the next process's store (nor lingers for the rest of the test
    # run). The catalog's close below no longer needs it: it waits for a commit in flight
    # (Catalog._writing; without that, closing beside a live worker could hang).
    for worker in (getattr(store, "maintenance", None), getattr(store, "segment_reader", None)):
        # Only a running thread: a SteppedWorker runs on the test's thread, and stopping it would
        # run its queued jobs; they simply never run.
        if isinstance(worker, WorkerThread) and type(worker).stop is WorkerThread.stop:
            worker.finish_queued_on_stop = False
            worker.stop(timeout=10)
    for tracker in list(getattr(store, "_trackers", {}).values()):
        # A journal group being written beside its caller (sync_interval_ms > 0): it lands or
        # not, as in a crash, but before anything reopens the files.
        behind = getattr(tracker, "_behind", None)
        if behind is not None:
            try:
                behind()
            except BaseException:  # noqa: BLE001 - what a dead process's write raised is nobody's
                pass
    catalog = getattr(store, "catalog", None)
    if catalog is not None:
        catalog.close()
    topics = getattr(store, "__dict__", {}).get("_topics_file")
    if topics is not None:
        topics.abandon()  # committed transactions stay (in the OS's cache); pending adds are lost
    fd = getattr(store, "_lock_fd", -1)
    if fd >= 0:
        try:
            os.close(fd)
        except OSError:
            pass
