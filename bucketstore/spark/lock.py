"""The store's write lock, seen from the processes of a Spark job.

``bucketstore.open`` holds an ``flock`` on ``store/LOCK`` and writes its pid
there. A bulk build writes the catalog from Spark's commit worker, a process
that is neither the user's driver interpreter nor long-lived, so two modes
exist:

* **held by the driver** (``build_store``): the driver opens the store for the
  whole job, so no tracker can seal, merge or remove orphans meanwhile. The
  other processes of the job cannot take an flock the driver holds; they check
  instead that it is still held and that ``LOCK`` names the driver's pid.
* **not held** (a plain ``df.write``): there is no long-lived process to hold
  it. Planning checks that no one has the store open, and the commit takes the
  lock for the length of the catalog transaction, so a store opened mid-job
  makes the commit fail instead of racing a live tracker.
"""

from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager

from ..errors import StoreLockedError
from .store_access import lock_path

__all__ = ["check_writable", "writer_lock"]


def _try_flock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise


def _holder(fd: int) -> str:
    return os.pread(fd, 64, 0).decode("ascii", "replace").strip()


def _verify_held_by(fd: int, store: str, holder_pid: int) -> None:
    if _try_flock(fd):
        raise StoreLockedError(f"{store}: the build's driver (pid {holder_pid}) no longer holds the store lock")
    holder = _holder(fd)
    if holder != str(holder_pid):
        raise StoreLockedError(f"{store} is open for writing by process {holder or '?'}, "
                               f"not by the build's driver (pid {holder_pid})")


def _open_lock(store: str) -> int:
    return os.open(lock_path(store), os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)


def check_writable(store: str, holder_pid: int | None) -> None:
    """Raise :class:`StoreLockedError` unless the build may write the store now.

    :param holder_pid: the pid of the driver that holds the lock for the build,
        or None when nobody should hold it.
    """
    fd = _open_lock(store)
    try:
        if holder_pid is not None:
            _verify_held_by(fd, store, holder_pid)
        elif not _try_flock(fd):
            raise StoreLockedError(f"{store} is open for writing by process {_holder(fd) or '?'}; "
                                   "close it before a bulk build")
    finally:
        os.close(fd)  # closing the descriptor releases a test flock taken above


@contextmanager
def writer_lock(store: str, holder_pid: int | None) -> Iterator[None]:
    """Be the store's one writer for the block: take the lock, or verify the driver holds it."""
    fd = _open_lock(store)
    try:
        if holder_pid is not None:
            _verify_held_by(fd, store, holder_pid)
        else:
            if not _try_flock(fd):
                raise StoreLockedError(f"{store} was opened for writing by process {_holder(fd) or '?'} "
                                       "during the bulk build; nothing was registered")
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode("ascii"), 0)
        yield
    finally:
        os.close(fd)
