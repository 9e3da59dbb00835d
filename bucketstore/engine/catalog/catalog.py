"""The catalog: an LMDB environment holding every tracker's cursor properties and state.

Four named databases:

``meta``
    ``format`` -> ``b"2"`` (``b"1"``: written before bucket summaries existed;
    a writable open turns it into ``b"2"``, the tracker backfills the summaries); ``next_ledger_id`` -> u64 LE: ledger ids are never
    handed out twice, even across crashes; ``store_id`` -> 32 hex digits, the
    store's identity, also written into every ledger file header and journal
    file header, so that a catalog and the files it describes prove they
    belong together.
``trackers``
    tracker name (UTF-8) -> msgpack map of the tracker's durable state
    (mark-delete position, delivery frontier, ...).
``buckets``
    tracker name, NUL, bucket key -> decimal ledger id. The bucket key is
    Pulsar's cursor-property key ``#pulsar.internal.delayed.bucket_<start>_<end>``
    and the value its snapshot ledger id, as Pulsar stores it.
``summaries``
    the same key -> the bucket's summary (:mod:`~bucketstore.format.bucket_summary`:
    ledger id, file size, count, segment table), put and removed in the same
    transaction as the key, so opening a tracker reads no ledger file. A key
    without a summary (a format-1 catalog, a rebuilt one) is summarised from
    its file's entry 0 when its tracker opens.

Every change of the set of buckets (seal, merge, trim, delete, clear) is one
write transaction, made only after the ledger files it references are durable.
LMDB's default ``sync=True`` makes a committed transaction durable when
:meth:`Catalog.commit` returns.
"""

from __future__ import annotations

import errno
import os
import secrets
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import lmdb

from ...errors import CatalogError
from ...format.catalog_codec import (CATALOG_FORMAT, NEXT_LEDGER_ID_KEY, READABLE_FORMATS, FORMAT_KEY, STORE_ID_KEY,
                                    CatalogRecordError, bucket_record_key, decode_ledger_id, decode_state,
                                    decode_store_id, decode_u64, encode_ledger_id, encode_state, encode_u64,
                                    is_store_id, split_record_key, tracker_prefix, validate_tracker_name)
from ..directory.store_lock import writer_pid
from .lmdb_file import check_data_file
from .map_gate import MapGate

__all__ = ["Catalog", "CatalogSnapshot", "CATALOG_FORMAT", "copy_catalog", "new_store_id",
           "read_catalog_quietly",
           "read_catalog_snapshot", "validate_tracker_name"]

_INITIAL_MAP_SIZE = 64 << 20
#: Catalogs open for writing in this process, by real path. LMDB refuses a second open of
#: one environment in a process, so a read-only open beside one of them reads through it.
_WRITERS: dict[str, "Catalog"] = {}
_WRITERS_LOCK = threading.Lock()


def new_store_id() -> str:
    """A fresh random store identity (128 bits as 32 lowercase hex digits)."""
    return secrets.token_hex(16)


class Catalog:
    """The store's LMDB catalog. One process writes it (the store's lock ensures that).

    :param path: the ``catalog/`` directory (created if missing unless ``readonly``).
    :param readonly: open for inspection only (the CLI).
    :param lockless: (with ``readonly``) open without LMDB's ``lock.mdb``: nothing is
        written or created, and nothing protects a read from a concurrent writer (see
        :func:`read_catalog_quietly`, which checks there is none).
    """

    def __init__(self, path: str | os.PathLike[str], *, readonly: bool = False, must_exist: bool = False,
                 lockless: bool = False) -> None:
        self.path = os.fspath(path)
        self.readonly = readonly
        #: A read-only catalog opened without LMDB's lock file (see :func:`read_catalog_snapshot`).
        self.lockless = False
        #: Called just before each write transaction commits (fault-injection seam).
        self.before_commit: Callable[[], None] | None = None
        #: The store's identity (None only for a read-only catalog written before store ids existed).
        self.store_id: str | None = None
        #: Every transaction of this process on the environment holds it shared; a map resize
        #: and :meth:`close` hold it alone. LMDB remaps the file on a resize (see map_gate); and
        #: py-lmdb's close from another thread marks a live write transaction finished without
        #: ending it, then waits for its owner to end it, which then commits nothing and reports
        #: no error, or (an operation raised, its error kept with the transaction in its
        #: traceback) never ends it: the close hung.
        self._gate = MapGate()
        data = os.path.join(self.path, "data.mdb")
        try:
            size = os.path.getsize(data)
        except FileNotFoundError:
            size = -1
        except OSError as exc:
            raise CatalogError(f"{data}: cannot read the catalog: {exc.strerror or exc}", path=data) from None
        if size <= 0 and (readonly or must_exist):
            # Never let LMDB create (or initialise an empty) data.mdb where a catalog must
            # be: the store's files would then look unreferenced, i.e. like garbage.
            what = "missing" if size < 0 else "empty (0 bytes)"
            raise CatalogError(f"{data}: the catalog is {what}" + ("" if readonly else
                               "; the store holds ledger or journal files, so nothing is opened or deleted "
                               "(run `bucketstore repair --rebuild-catalog STORE`)"), path=data)
        if size > 0:
            check_data_file(data)  # a truncated file would kill the process with SIGBUS once mapped
        try:
            if readonly and lockless:
                self._env, self.lockless = lmdb.open(self.path, map_size=_INITIAL_MAP_SIZE, max_dbs=4, readonly=True,
                                                     lock=False, subdir=True, create=False), True
            elif readonly:
                self._env, self.lockless = _open_readonly_environment(self.path)
            else:
                self._env = lmdb.open(self.path, map_size=_INITIAL_MAP_SIZE, max_dbs=4, subdir=True)
            if readonly:
                self._meta = self._env.open_db(b"meta", create=False)
                self._trackers = self._env.open_db(b"trackers", create=False)
                self._buckets = self._env.open_db(b"buckets", create=False)
                try:
                    self._summaries = self._env.open_db(b"summaries", create=False)
                except lmdb.NotFoundError:  # a format-1 catalog: no summaries yet
                    self._summaries = None
            else:
                self._meta = self._env.open_db(b"meta")
                self._trackers = self._env.open_db(b"trackers")
                self._buckets = self._env.open_db(b"buckets")
                self._summaries = self._env.open_db(b"summaries")
        except lmdb.Error as exc:
            self.close()
            raise CatalogError(f"{self.path}: cannot open the LMDB catalog: {exc}", path=self.path) from None
        try:
            if readonly:
                with self._txn() as txn:
                    self.store_id = self._decode_store_id(txn.get(STORE_ID_KEY, db=self._meta))
            else:
                self._env.reader_check()  # clear reader slots left by killed processes
                with self._txn(write=True) as txn:
                    fmt = txn.get(FORMAT_KEY, db=self._meta)
                    if fmt is None:
                        if must_exist:
                            raise CatalogError(f"{data}: the catalog is new (no format record), but the store "
                                               "holds ledger or journal files: refusing to treat them as "
                                               "garbage (run `bucketstore repair --rebuild-catalog STORE`)",
                                               path=data)
                        txn.put(FORMAT_KEY, CATALOG_FORMAT, db=self._meta)
                    elif fmt not in READABLE_FORMATS:
                        raise CatalogError(f"{self.path}: catalog format {fmt!r} is not supported", path=self.path)
                    elif fmt != CATALOG_FORMAT:
                        # Format 1 differs only by lacking summaries, which format 2 allows per
                        # key (backfilled at the tracker's open): marking it 2 keeps older code,
                        # which would not maintain the summaries, from opening it for writing.
                        txn.put(FORMAT_KEY, CATALOG_FORMAT, db=self._meta)
                    store_id = self._decode_store_id(txn.get(STORE_ID_KEY, db=self._meta))
                    if store_id is None:  # a new store, or one from before store ids: give it one
                        store_id = new_store_id()
                        txn.put(STORE_ID_KEY, store_id.encode("ascii"), db=self._meta)
                    self.store_id = store_id
        except lmdb.Error as exc:
            self.close()
            raise CatalogError(f"{self.path}: cannot read the LMDB catalog: {exc}", path=self.path) from None
        except BaseException:
            self.close()
            raise
        if not readonly:
            with _WRITERS_LOCK:
                _WRITERS[os.path.realpath(self.path)] = self

    def _decode_store_id(self, raw: bytes | None) -> str | None:
        if raw is None:
            return None
        try:
            return decode_store_id(raw)
        except CatalogRecordError as exc:
            raise CatalogError(f"{self.path}: store_id {exc}", path=self.path) from None

    def _live_env(self) -> lmdb.Environment:
        env = self._env
        if env is None:
            raise CatalogError(f"{self.path}: the catalog is closed", path=self.path)
        return env

    @contextmanager
    def _txn(self, write: bool = False) -> Iterator[lmdb.Transaction]:
        """A transaction (values copied out as bytes), holding the map gate shared."""
        with self._gate.shared():
            with self._live_env().begin(write=write, buffers=False) as txn:
                yield txn

    # -- reads ----------------------------------------------------------------------------------
    def next_ledger_id(self) -> int:
        """The smallest ledger id never handed out (0 for a new store)."""
        with self._txn() as txn:
            raw = txn.get(NEXT_LEDGER_ID_KEY, db=self._meta)
        return self._decode_next(raw)

    def _decode_next(self, raw: bytes | None) -> int:
        if raw is None:
            return 0
        try:
            return decode_u64(raw)
        except CatalogRecordError as exc:
            raise CatalogError(f"{self.path}: next_ledger_id is {exc}", path=self.path) from None

    def tracker_names(self) -> list[str]:
        """Every tracker the catalog knows, sorted."""
        with self._txn() as txn:
            return [self._decode_name(k) for k, _ in txn.cursor(db=self._trackers)]

    def tracker_state(self, name: str) -> dict[str, Any] | None:
        """A tracker's durable state, or None if the tracker does not exist."""
        key = validate_tracker_name(name)
        with self._txn() as txn:
            raw = txn.get(key, db=self._trackers)
        if raw is None:
            return None
        return self._decode_state(name, raw)

    def _decode_state(self, name: str, raw: bytes) -> dict[str, Any]:
        try:
            return decode_state(raw)
        except CatalogRecordError as exc:
            raise CatalogError(f"{self.path}: state of tracker {name!r} is {exc}", path=self.path, key=name) from None

    def buckets(self, name: str) -> dict[str, int]:
        """A tracker's cursor properties: bucket key -> ledger id."""
        prefix = tracker_prefix(name)
        with self._txn() as txn:
            return {key: self._ledger_of(name, key, v) for key, v in _under(txn.cursor(db=self._buckets), prefix)}

    def _ledger_of(self, name: str, key: str, raw: bytes) -> int:
        try:
            return decode_ledger_id(raw)
        except CatalogRecordError:
            raise CatalogError(f"{self.path}: tracker {name!r} key {key!r} holds {raw!r}, "
                               "not a ledger id", path=self.path, key=key) from None

    def all_buckets(self) -> dict[str, dict[str, int]]:
        """Every tracker's cursor properties."""
        return {name: self.buckets(name) for name in self.tracker_names()}

    def keys_and_summaries(self, name: str) -> tuple[dict[str, int], dict[str, bytes]]:
        """A tracker's bucket keys (key -> ledger id) and their summaries (key -> encoded
        summary; keys without one are missing), read in one transaction."""
        prefix = tracker_prefix(name)
        with self._txn() as txn:
            keys = {key: self._ledger_of(name, key, v) for key, v in _under(txn.cursor(db=self._buckets), prefix)}
            summaries = (dict(_under(txn.cursor(db=self._summaries), prefix))
                         if self._summaries is not None else {})
        return keys, summaries

    def last_txnid(self) -> int:
        """The id of the last committed write transaction (it moves with every commit)."""
        return int(self._env.info()["last_txnid"])

    def tracker_snapshot(self, name: str) -> "CatalogSnapshot":
        """One tracker's state, keys and summaries, with the allocator, in one read transaction."""
        raw_name = validate_tracker_name(name)
        prefix = tracker_prefix(name)
        with self._txn() as txn:
            raw_next = txn.get(NEXT_LEDGER_ID_KEY, db=self._meta)
            raw_state = txn.get(raw_name, db=self._trackers)
            keys = {key: self._ledger_of(name, key, v) for key, v in _under(txn.cursor(db=self._buckets), prefix)}
            summaries = (dict(_under(txn.cursor(db=self._summaries), prefix))
                         if self._summaries is not None else {})
        return CatalogSnapshot(self.path, self._decode_next(raw_next),
                               {} if raw_state is None else {name: self._decode_state(name, raw_state)},
                               {name: keys} if keys else {}, self.store_id, {name: summaries} if summaries else {})

    def _snapshot(self) -> "CatalogSnapshot":
        """Every tracker's state and keys and the allocator, in one read transaction."""
        with self._txn() as txn:
            return self._snapshot_in(txn)

    def copy_to(self, dest: str) -> "CatalogSnapshot":
        """Write a compact copy of the catalog into the empty directory ``dest`` and return
        what it holds: both from one read transaction, so the copy is one commit of the
        writer and the snapshot describes exactly that commit (see
        :mod:`~bucketstore.engine.store.checkpoint`). LMDB's copy does not fsync; the caller does.
        """
        try:
            with self._txn() as txn:
                snapshot = self._snapshot_in(txn)
                self._env.copy(dest, compact=True, txn=txn)
        except lmdb.MapResizedError:
            raise  # another process grew the map: copy_catalog opens the environment again
        except lmdb.Error as exc:
            raise CatalogError(f"{self.path}: cannot copy the LMDB catalog: {exc}", path=self.path) from None
        return snapshot

    def _snapshot_in(self, txn: lmdb.Transaction) -> "CatalogSnapshot":
        states: dict[str, dict[str, Any]] = {}
        keys: dict[str, dict[str, int]] = {}
        raw_next = txn.get(NEXT_LEDGER_ID_KEY, db=self._meta)
        raw_states = list(txn.cursor(db=self._trackers))
        raw_keys = list(txn.cursor(db=self._buckets))
        raw_summaries = list(txn.cursor(db=self._summaries)) if self._summaries is not None else []
        next_ledger_id = self._decode_next(raw_next)
        for raw_name, raw in raw_states:
            name = self._decode_name(raw_name)
            states[name] = self._decode_state(name, raw)
        for k, v in raw_keys:
            if b"\x00" not in k:
                raise CatalogError(f"{self.path}: bucket key {k!r} has no tracker name", path=self.path)
            raw_name, key = split_record_key(k)
            name = self._decode_name(raw_name)
            keys.setdefault(name, {})[key] = self._ledger_of(name, key, v)
        summaries: dict[str, dict[str, bytes]] = {}
        for k, v in raw_summaries:
            raw_name, key = split_record_key(k)
            summaries.setdefault(self._decode_name(raw_name), {})[key] = v
        return CatalogSnapshot(self.path, next_ledger_id, states, keys,
                               self.store_id, summaries)

    def _decode_name(self, raw: bytes) -> str:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise CatalogError(f"{self.path}: a tracker name is not UTF-8: {raw!r}", path=self.path) from None

    # -- writes ---------------------------------------------------------------------------------
    def commit(self, name: str, *, put: Mapping[str, int] | None = None, remove: Iterable[str] = (),
               state: Mapping[str, Any] | None = None, next_ledger_id: int | None = None,
               summaries: Mapping[str, bytes] | None = None) -> None:
        """Apply one tracker's changes in a single durable write transaction.

        ``put`` adds bucket keys, ``remove`` removes them (missing keys are fine) with
        their summaries, ``summaries`` sets keys' summaries (a put key without one loses
        any older summary: it described another file, and is backfilled at the next open),
        ``state`` replaces the tracker's state (and registers the tracker),
        ``next_ledger_id`` raises the allocator. All or nothing.
        """
        prefix = tracker_prefix(name)
        packed_state = encode_state(state) if state is not None else None

        def apply(txn: lmdb.Transaction) -> None:
            for key in remove:
                txn.delete(bucket_record_key(prefix, key), db=self._buckets)
                txn.delete(bucket_record_key(prefix, key), db=self._summaries)
            for key, ledger_id in (put or {}).items():
                txn.put(bucket_record_key(prefix, key), encode_ledger_id(ledger_id), db=self._buckets)
                if not summaries or key not in summaries:
                    txn.delete(bucket_record_key(prefix, key), db=self._summaries)
            for key, raw in (summaries or {}).items():
                txn.put(bucket_record_key(prefix, key), raw, db=self._summaries)
            if packed_state is not None:
                txn.put(prefix[:-1], packed_state, db=self._trackers)
            if next_ledger_id is not None:
                current = txn.get(NEXT_LEDGER_ID_KEY, db=self._meta)
                if current is None or decode_u64(current) < next_ledger_id:
                    txn.put(NEXT_LEDGER_ID_KEY, encode_u64(next_ledger_id), db=self._meta)

        self._write(apply)

    def restore(self, store_id: str, buckets: Mapping[str, Mapping[str, int]], next_ledger_id: int,
                states: Mapping[str, Mapping[str, Any]]) -> None:
        """Fill a new catalog in one transaction (``bucketstore repair --rebuild-catalog``):
        the store id found in the files, every tracker's keys and state, the allocator."""
        if not is_store_id(store_id):
            raise ValueError(f"store_id must be 32 lowercase hex digits, not {store_id!r}")

        def apply(txn: lmdb.Transaction) -> None:
            txn.put(STORE_ID_KEY, store_id.encode("ascii"), db=self._meta)
            txn.put(NEXT_LEDGER_ID_KEY, encode_u64(next_ledger_id), db=self._meta)
            for name in set(buckets) | set(states):
                prefix = tracker_prefix(name)
                txn.put(prefix[:-1], encode_state(states.get(name, {})), db=self._trackers)
                for key, ledger_id in buckets.get(name, {}).items():
                    txn.put(bucket_record_key(prefix, key), encode_ledger_id(ledger_id), db=self._buckets)

        self._write(apply)
        self.store_id = store_id

    def delete_tracker(self, name: str) -> None:
        """Remove a tracker's state and every one of its bucket keys, in one transaction."""
        prefix = tracker_prefix(name)

        def apply(txn: lmdb.Transaction) -> None:
            for db in (self._buckets, self._summaries):
                cur = txn.cursor(db=db)
                if cur.set_range(prefix):
                    while cur.key().startswith(prefix):
                        if not cur.delete():
                            break
            txn.delete(prefix[:-1], db=self._trackers)

        self._write(apply)

    def _write(self, apply: Callable[[lmdb.Transaction], None]) -> None:
        if self.readonly:
            raise CatalogError(f"{self.path}: catalog is open read-only", path=self.path)
        while True:
            try:
                with self._txn(write=True) as txn:
                    apply(txn)
                    if self.before_commit is not None:
                        self.before_commit()
                return
            except lmdb.MapFullError:
                # The `with` block has aborted the transaction; grow the map and redo it.
                with self._gate.exclusive():
                    env = self._live_env()
                    env.set_mapsize(env.info()["map_size"] * 2)
            except lmdb.Error as exc:
                raise CatalogError(f"{self.path}: catalog write failed: {exc}", path=self.path) from None

    def close(self) -> None:
        """Close the environment, once a write transaction in flight on another thread has
        ended (a later write raises :class:`CatalogError`). Idempotent."""
        with _WRITERS_LOCK:
            if _WRITERS.get(os.path.realpath(self.path)) is self:
                del _WRITERS[os.path.realpath(self.path)]
        with self._gate.exclusive():  # no transaction of this process is left running
            env, self._env = getattr(self, "_env", None), None
            if env is not None:
                env.close()

    def __enter__(self) -> "Catalog":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- read-only snapshots (the CLI's inspection commands, the Spark reader) ---------------------------
def _open_readonly_environment(path: str) -> tuple[lmdb.Environment, bool]:
    """Open the environment read-only, registered in LMDB's reader table when possible.

    A reader must use ``lock.mdb``: its slot in the reader table stops a live
    writer from reusing the pages of the snapshot it reads. Without it, a
    commit can overwrite those pages mid-read and the reader sees a torn view.
    Registering needs write access to ``lock.mdb`` (LMDB opens it read-write,
    and creates it if missing). When that is refused — a read-only directory
    or file system, another user's store — the environment is opened without
    the lock and the second value is True; :func:`read_catalog_snapshot` then
    reads only while no writer holds the store.
    """
    try:
        return lmdb.open(path, map_size=_INITIAL_MAP_SIZE, max_dbs=4, readonly=True, lock=True, subdir=True,
                         create=False), False
    except lmdb.Error as exc:
        if not _is_permission_error(exc):
            raise
    return lmdb.open(path, map_size=_INITIAL_MAP_SIZE, max_dbs=4, readonly=True, lock=False, subdir=True,
                     create=False), True


def _is_permission_error(exc: lmdb.Error) -> bool:
    text = str(exc)
    return any(os.strerror(code) in text for code in (errno.EACCES, errno.EPERM, errno.EROFS))


@dataclass(frozen=True)
class CatalogSnapshot:
    """The whole catalog as of one committed transaction: the same read methods as :class:`Catalog`.

    Taken by :func:`read_catalog_snapshot` in a single LMDB read transaction,
    so every tracker's keys, states and the allocator belong to one commit of
    the writer (never half of a seal or a merge).
    """

    path: str
    next_id: int
    states: dict[str, dict[str, Any]]
    keys: dict[str, dict[str, int]]
    #: The store's identity (None for a catalog written before store ids existed).
    store_id: str | None = None
    #: tracker -> bucket key -> encoded bucket summary (keys without one are missing).
    summaries: dict[str, dict[str, bytes]] = field(default_factory=dict)

    def next_ledger_id(self) -> int:
        return self.next_id

    def tracker_names(self) -> list[str]:
        return sorted(self.states.keys() | self.keys.keys())

    def tracker_state(self, name: str) -> dict[str, Any] | None:
        return self.states.get(name)

    def buckets(self, name: str) -> dict[str, int]:
        return dict(self.keys.get(name, {}))

    def all_buckets(self) -> dict[str, dict[str, int]]:
        return {name: self.buckets(name) for name in self.tracker_names()}

    def keys_and_summaries(self, name: str) -> tuple[dict[str, int], dict[str, bytes]]:
        return self.buckets(name), dict(self.summaries.get(name, {}))

    def referenced_ledgers(self) -> set[int]:
        """Every ledger id a key of any tracker names."""
        return {lid for keys in self.keys.values() for lid in keys.values()}

    def close(self) -> None:
        """Nothing to release (the snapshot is plain data); kept so it replaces a read-only Catalog."""

    def __enter__(self) -> "CatalogSnapshot":
        return self

    def __exit__(self, *exc: object) -> None:
        pass


_T = TypeVar("_T")


def read_catalog_snapshot(path: str | os.PathLike[str], *, attempts: int = 5, quiet: bool = False) -> CatalogSnapshot:
    """Read a catalog, possibly beside a live writer, in one read transaction.

    Normally the read registers in ``lock.mdb`` (see
    :func:`_open_readonly_environment`), which makes it safe against any
    concurrent commit. When ``lock.mdb`` cannot be opened for writing, the
    read goes ahead without it only while no process holds the store's write
    lock, checked before and after the read; beside a live writer it raises
    :class:`CatalogError` instead of risking a torn view.

    :param path: the ``catalog/`` directory.
    :param attempts: re-opens when the writer grew the map under the reader.
    :param quiet: write nothing when no writer runs (see :func:`read_catalog_quietly`):
        ``lock.mdb`` is then neither registered in nor created.
    :raises CatalogError: no catalog, an unreadable or damaged one, or the lock-less case beside a writer.
    """
    if quiet:
        return read_catalog_quietly(path, Catalog._snapshot, attempts=attempts)
    return _read_registered(path, Catalog._snapshot, attempts=attempts, what="read")


def copy_catalog(path: str | os.PathLike[str], dest: str, *, attempts: int = 5) -> CatalogSnapshot:
    """Copy a catalog, possibly beside a live writer in another process, without its lock.

    :meth:`Catalog.copy_to` on a read-only environment registered as a reader (the same
    rules as :func:`read_catalog_snapshot`, lock-less refusal included): the copy in
    ``dest`` (an empty directory) and the returned snapshot are one commit of the writer.
    """
    def start_afresh() -> None:  # a partial copy before the map grew: the next one starts clean
        for name in os.listdir(dest):
            os.unlink(os.path.join(dest, name))

    with _WRITERS_LOCK:
        writer = _WRITERS.get(os.path.realpath(os.fspath(path)))
    if writer is not None:
        # The writer is this process (a read-only handle beside it): LMDB allows one open of
        # an environment per process, so the copy's read transaction is taken on the writer's.
        try:
            return writer.copy_to(dest)
        except CatalogError:
            if writer._env is not None:
                raise
            start_afresh()  # it closed meanwhile: copy from the files, as another process would
    return _read_registered(path, lambda catalog: catalog.copy_to(dest), attempts=attempts, what="copied",
                            on_resized=start_afresh)


def _read_registered(path: str | os.PathLike[str], read: Callable[[Catalog], _T], *, attempts: int, what: str,
                     on_resized: Callable[[], None] | None = None) -> _T:
    """Run ``read`` on a read-only environment registered in LMDB's reader table, opened
    again when the writer grows the map meanwhile; refused when it could only be opened
    lock-less beside a live writer (nothing would keep its pages from being reused)."""
    path = os.fspath(path)
    store = os.path.dirname(os.path.abspath(path))
    for _ in range(attempts):
        catalog = Catalog(path, readonly=True)
        try:
            if catalog.lockless and (writer_pid(store) is not None):
                raise _lockless_refusal(path)
            try:
                result = read(catalog)  # one read transaction
            except lmdb.MapResizedError:
                if on_resized is not None:
                    on_resized()
                continue  # the writer grew the map after we opened: open again and read again
            except lmdb.Error as exc:
                raise CatalogError(f"{path}: cannot read the LMDB catalog: {exc}", path=path) from None
            if catalog.lockless and (writer_pid(store) is not None):
                raise _lockless_refusal(path)
            return result
        finally:
            catalog.close()
    raise CatalogError(f"{path}: the catalog map kept growing while being {what} ({attempts} attempts)", path=path)


def read_catalog_quietly(path: str | os.PathLike[str], read: Callable[[Catalog], _T], *, attempts: int = 5) -> _T:
    """Run ``read`` (one read transaction) on a catalog, writing as little as LMDB allows.

    What ``bucketstore.open(path, read_only=True)`` uses. With no writer holding the
    store, the environment is opened without ``lock.mdb``: not a byte is written, not
    even a reader slot, and no file is created. Nothing then protects the pages being
    read, so the read is checked afterwards: the store's write lock must still be free
    and LMDB's last transaction id unchanged, else it is done again. Beside a live
    writer the read registers in ``lock.mdb``'s reader table (that writer's environment
    has the file open already; the slot is the only byte written), which is what keeps
    the writer from reusing the snapshot's pages mid-read. Beside a writer in this same
    process (LMDB allows one open of an environment per process), the read goes through
    that writer's environment.

    :param path: the ``catalog/`` directory.
    :raises CatalogError: no catalog, a damaged one, or no way to read it safely
        beside a writer (no write access to ``lock.mdb``).
    """
    path = os.fspath(path)
    with _WRITERS_LOCK:
        writer = _WRITERS.get(os.path.realpath(path))
    if writer is not None:  # this process writes the store: read through its environment
        with writer._gate.shared():
            if writer._env is not None:
                try:
                    return read(writer)
                except lmdb.Error as exc:
                    raise CatalogError(f"{path}: cannot read the LMDB catalog: {exc}", path=path) from None
    store = os.path.dirname(os.path.abspath(path))
    for _ in range(attempts):
        quiet = writer_pid(store) is None
        catalog = Catalog(path, readonly=True, lockless=quiet)
        try:
            if catalog.lockless and not quiet:
                raise _lockless_refusal(path)
            try:
                before = catalog.last_txnid() if quiet else None
                result = read(catalog)
                if quiet and (writer_pid(store) is not None or catalog.last_txnid() != before):
                    continue  # a writer came up meanwhile: read again, registered as a reader
            except lmdb.MapResizedError:
                continue  # the writer grew the map after we opened: open again and re-read
            except lmdb.Error as exc:
                raise CatalogError(f"{path}: cannot read the LMDB catalog: {exc}", path=path) from None
            return result
        finally:
            catalog.close()
    raise CatalogError(f"{path}: the catalog kept changing while being read ({attempts} attempts)", path=path)


def _lockless_refusal(path: str) -> CatalogError:
    return CatalogError(f"{path}: cannot register as a reader in lock.mdb (no write access), and a writer "
                        "has the store open: a lock-less read could see a torn view; retry when it is closed "
                        "or with write access to lock.mdb", path=path)


def _under(cur: lmdb.Cursor, prefix: bytes) -> Iterator[tuple[str, bytes]]:
    """The (key after ``prefix``, value) pairs of the records whose key starts with ``prefix``."""
    if cur.set_range(prefix):
        for k, v in cur:
            if not k.startswith(prefix):
                break
            yield k[len(prefix):].decode("utf-8", "replace"), v
