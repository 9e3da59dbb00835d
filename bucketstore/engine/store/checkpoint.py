"""Online checkpoints: a consistent copy of a store beside its live writer.

:func:`make_checkpoint` copies a store into a new directory while a writer keeps
adding, sealing, merging, delivering and deleting, without the writer's lock
(``bucketstore checkpoint`` in another process) or inside the writer's own process
(:meth:`Store.checkpoint <bucketstore.engine.store.store.Store.checkpoint>`). The copy
opens as a store holding every index acknowledged before the call. It is a *crash
image*: a state the writer's own crash could have left, give or take what happened
during the copy, so recovery accepts it and the crash tests cover it.

What is copied, and how:

* **ledger files** are immutable once renamed into place and their ids are never
  reused, so a hard link is a perfect copy (``os.link``; where the file system
  refuses — another device, ``EPERM`` — a copy, fsynced). Every file is *pinned*
  (linked or copied) as soon as it is seen, so a merge or a deletion that
  unlinks it afterwards takes nothing from the checkpoint;
* **the catalog** is copied by LMDB in one read transaction
  (``env.copy(compact=True)``), which also gives the list of bucket keys the copy
  holds: one commit of the writer, never half a seal or a merge;
* **each journal** is copied up to its last whole group (a group being written is a
  torn tail: not durable, so no call relied on it), *twice*: once before the
  catalog, once after.

Why this order loses nothing (``J1`` the first journal image, ``C`` the catalog,
``J2`` the second image; the writer's steps and their order are in
``seal_pipeline``, ``merge_pipeline`` and ``tracker``):

1. An add acknowledged before the call is, when ``J1`` is read, in the journal or
   in a sealed bucket whose key was committed before the seal's journal checkpoint
   removed its rows (catalog first, journal second). If its rows were in ``J1``, the
   copy has them whatever ``C`` says; if not, the key was committed before ``J1``,
   so ``C`` has it or a merge of it (the catalog is copied after the journal), and
   the file was pinned before anyone could unlink it (pinned before ``C``, or
   after ``C`` while ``C`` still names it: a file ``C`` names is unlinked only
   after a later commit, which is detected and ``C`` taken again).
   Taking the catalog first would lose exactly these rows: a seal between the two
   copies moves them from the journal into a bucket ``C`` does not know.
2. What ``J1`` and ``C`` disagree on is what a crash between a seal's catalog
   commit and its journal checkpoint leaves: rows both in the journal and in a
   bucket. Recovery already treats a journal add of a tracked position as a
   duplicate (the crash-point tests kill the writer exactly there).
3. The one step of the writer that goes the other way round — journal first,
   catalog second — is the deletion of a bucket read to its end: the rows of it
   delivered in a batch whose confirmation is not durable are appended to the
   journal, then the key is removed. With ``J1`` before that append and ``C`` after
   the removal, the copy would lose those rows, which a crash would deliver again.
   ``J2``, read after ``C``, has the append; so the copy's journal is ``J1`` plus
   every add, untrack and frontier record ``J2`` holds beyond ``J1`` (the same
   file's new groups, and all records of newer files, when a journal checkpoint
   came between). Records journaled after ``C`` only add acknowledged indexes, untrack
   positions that were untracked, or raise the delivery frontier (a prefix of the
   index order delivered and confirmed before the copy ended): never a phantom.
4. The mark-delete position lives in the catalog (the tracker's state), the delivery
   frontier in the journal. Both only move forward and are applied at recovery to
   whatever rows the copy holds, so a newer one drops only what the embedder had
   acknowledged or confirmed before the copy ended. A tracker ``C`` does not name (a
   deletion in progress) has its journal left out.

What a crash of the *writer* cannot leave but a concurrent ``clear()`` can: rows the
clear removed coming back (``J1`` before it, ``C`` after), exactly as after a crash in
the middle of ``clear()``.

The copy is written under a temporary name beside ``dest`` (``.<name>.checkpoint-*``),
every file and directory fsynced, then renamed to ``dest`` and the parent fsynced:
a crash leaves either nothing at ``dest`` or the whole checkpoint (and perhaps the
temporary directory, which may be deleted). Nothing is ever written into the source (but
the reader slot LMDB takes in ``catalog/lock.mdb``, as every reader of the catalog does). The
copy keeps the source's store id: its files carry it.
"""

from __future__ import annotations

import errno
import os
import re
import secrets
import shutil
from dataclasses import dataclass, field

from ...errors import CheckpointError
from ...format.fs import REAL_FS, FileSystem
from ...format.ledger_file import ledger_file_name
from ..catalog.catalog import Catalog, CatalogSnapshot, copy_catalog
from ..durability.journal import journal_directory
from ..durability.journal_copy import JournalFile, combine, read_journal
from ..topics.topic_file import copy_topics

__all__ = ["CheckpointReport", "make_checkpoint", "check_destination"]

_LEDGER_NAME = re.compile(r"^(\d{20})\.ledger$")
#: Fresh catalog copies to take while files it names keep being unlinked before they are pinned.
ATTEMPTS = 20
#: Link failures that mean "this file system cannot link here": copy instead.
_NO_LINK = (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP)
_CHUNK = 1 << 20


@dataclass
class CheckpointReport:
    """What a checkpoint holds and how it was made."""

    path: str
    trackers: list[str] = field(default_factory=list)
    ledger_files: int = 0
    #: Ledger files hard-linked (sharing the source's inode) and copied.
    linked: int = 0
    copied: int = 0
    copied_bytes: int = 0
    journal_files: int = 0
    #: Catalog copies taken (more than 1: files it named were unlinked before being pinned).
    catalog_copies: int = 0


def check_destination(dest: str | os.PathLike[str], source: str | os.PathLike[str]) -> str:
    """``dest`` as an absolute path, if a checkpoint may be written there.

    :raises ValueError: ``dest`` exists and is not an empty directory, or lies inside
        the source store (a checkpoint never writes into its source).
    """
    if not os.fspath(dest):
        # abspath("") is the working directory: never take it for the destination.
        raise ValueError("checkpoint destination is empty: give the path of a new or empty directory")
    path = os.path.abspath(os.fspath(dest))
    if os.path.lexists(path):
        if not os.path.isdir(path) or os.path.islink(path):
            raise ValueError(f"checkpoint destination {path} exists and is not a directory")
        if os.listdir(path):
            raise ValueError(f"checkpoint destination {path} is not empty")
    real_source = os.path.realpath(source)
    real_parent = os.path.realpath(os.path.dirname(path))
    if os.path.commonpath([real_source, os.path.join(real_parent, os.path.basename(path))]) == real_source:
        raise ValueError(f"checkpoint destination {path} lies inside the store {real_source}")
    return path


def make_checkpoint(source: str | os.PathLike[str], dest: str | os.PathLike[str], *,
                    catalog: Catalog | None = None, fs: FileSystem = REAL_FS) -> CheckpointReport:
    """Copy the store at ``source`` into ``dest`` consistently, beside a live writer.

    :param dest: must not exist, or be an empty directory; its parent is created if missing.
    :param catalog: the writer's own open catalog (in its process LMDB forbids a second
        environment on the same file); None opens it read-only, as the CLI's readers do.
    :raises ValueError: a bad ``dest`` (see :func:`check_destination`).
    :raises CatalogError: the source has no readable catalog.
    :raises JournalError: a journal is damaged beyond a torn tail.
    :raises CheckpointError: the writer kept unlinking files the catalog named faster than
        they could be pinned.
    """
    source = os.path.abspath(os.fspath(source))
    path = check_destination(dest, source)
    parent = os.path.dirname(path)
    fs.makedirs(parent)
    tmp = os.path.join(parent, f".{os.path.basename(path)}.checkpoint-{secrets.token_hex(4)}")
    os.mkdir(tmp)
    try:
        report = _copy(source, tmp, catalog, fs, path)
        _sync_tree(tmp, fs)
        try:
            fs.rename(tmp, path)  # onto an empty directory too: rename(2) replaces it
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
                raise ValueError(f"checkpoint destination {path} was filled while the checkpoint ran") from None
            raise
        fs.fsync_dir(parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    report.path = path
    return report


def _copy(source: str, tmp: str, catalog: Catalog | None, fs: FileSystem, dest: str) -> CheckpointReport:
    report = CheckpointReport(tmp)
    src_ledgers, src_journal = os.path.join(source, "ledgers"), os.path.join(source, "journal")
    ledgers, catalog_dir, journal = (os.path.join(tmp, d) for d in ("ledgers", "catalog", "journal"))
    for d in (ledgers, catalog_dir):
        os.mkdir(d)
    # 1. Every journal, before the catalog (argument 1 of the module docstring).
    first = {name: read_journal(os.path.join(src_journal, name))
             for name in (sorted(os.listdir(src_journal)) if os.path.isdir(src_journal) else [])}
    # 2. Pin every ledger file there is now; a file unlinked before we get to it was retired
    #    by a commit that the catalog copy below already sees.
    pin = _Pinner(src_ledgers, ledgers, fs, report)
    for name in sorted(os.listdir(src_ledgers)) if os.path.isdir(src_ledgers) else []:
        if _LEDGER_NAME.match(name):
            pin(name)
    # 3. The catalog in one read transaction; then the files it names that were sealed
    #    meanwhile. One unlinked before it was pinned: a later commit retired it, so copy
    #    the catalog again (the journal images stay valid for any later catalog).
    for _ in range(ATTEMPTS):
        report.catalog_copies += 1
        snapshot = catalog.copy_to(catalog_dir) if catalog is not None \
            else copy_catalog(os.path.join(source, "catalog"), catalog_dir)
        wanted = {ledger_file_name(lid) for lid in snapshot.referenced_ledgers()}
        missing = [name for name in sorted(wanted) if name not in pin.pinned and not pin(name)]  # pins the rest
        if not missing:
            break
        for name in os.listdir(catalog_dir):
            os.unlink(os.path.join(catalog_dir, name))
    else:
        raise CheckpointError(dest, f"the writer kept retiring ledger files faster than they could be pinned "
                                   f"({ATTEMPTS} catalog copies)")
    for name in sorted(set(pin.pinned) - wanted):  # seen in the directory, not in this commit
        os.unlink(os.path.join(ledgers, name))
    report.ledger_files = len(wanted)
    report.linked = sum(1 for name in wanted if pin.pinned[name] == "linked")
    report.copied = len(wanted) - report.linked
    # 4. Every journal again, after the catalog (argument 3), for the trackers it names.
    report.trackers = snapshot.tracker_names()
    _copy_journals(source, journal, snapshot, first, fs, report)
    copy_topics(source, tmp)  # 5. The topics: a file of their own, referring to nothing above.
    return report


def _copy_journals(source: str, journal: str, snapshot: CatalogSnapshot, first: dict[str, list[JournalFile]],
                   fs: FileSystem, report: CheckpointReport) -> None:
    for tracker in snapshot.tracker_names():
        directory = journal_directory(source, tracker)
        name = os.path.basename(directory)
        later = read_journal(directory)
        files = combine(first.get(name, []), later)
        if not files:
            continue
        target = os.path.join(journal, name)
        os.makedirs(target, exist_ok=True)
        for file_name, data in files:
            fd = fs.create(os.path.join(target, file_name))
            try:
                fs.write(fd, data)
                fs.fsync(fd)
            finally:
                fs.close(fd)
        report.journal_files += len(files)


class _Pinner:
    """Links (or copies) source ledger files into the checkpoint as soon as they are seen."""

    def __init__(self, source: str, dest: str, fs: FileSystem, report: CheckpointReport) -> None:
        self.source, self.dest, self.fs, self.report = source, dest, fs, report
        #: file name -> "linked" or "copied"
        self.pinned: dict[str, str] = {}
        self._can_link = True

    def __call__(self, name: str) -> bool:
        """Pin one file; False if the writer had already unlinked it."""
        src, dst = os.path.join(self.source, name), os.path.join(self.dest, name)
        try:
            if self._can_link:
                try:
                    os.link(src, dst, follow_symlinks=False)
                    self.pinned[name] = "linked"
                    return True
                except OSError as exc:
                    if exc.errno not in _NO_LINK:
                        raise
                    self._can_link = False  # the same for every file of this pair of directories
            self.report.copied_bytes += _copy_file(src, dst, self.fs)
            self.pinned[name] = "copied"
            return True
        except FileNotFoundError:
            return False


def _copy_file(src: str, dst: str, fs: FileSystem) -> int:
    """Copy one immutable file and fsync the copy; the source is opened first, so an unlink
    by the writer while it is read takes nothing away."""
    with open(src, "rb") as f:
        fd = fs.create(dst)
        size = 0
        try:
            while chunk := f.read(_CHUNK):
                fs.write(fd, chunk)
                size += len(chunk)
            fs.fsync(fd)
        finally:
            fs.close(fd)
    return size


def _sync_tree(root: str, fs: FileSystem) -> None:
    """fsync what LMDB's copy wrote (it does not), then every directory, deepest first."""
    data = os.path.join(root, "catalog", "data.mdb")
    fd = os.open(data, os.O_RDONLY)
    try:
        fs.fsync(fd)
    finally:
        os.close(fd)
    for directory, _, _ in sorted(os.walk(root), key=lambda entry: -entry[0].count(os.sep)):
        fs.fsync_dir(directory)
