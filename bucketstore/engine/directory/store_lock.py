"""The store's single-writer lock: ``STORE/LOCK``, flock'ed by the one process that writes.

A writer takes it exclusively for as long as the store is open and records its pid in the
file, so a second writer gets :class:`~bucketstore.errors.StoreLockedError` naming the holder.
Readers (the CLI, the Spark reader, a catalog rebuild's refusal) only ask who holds it: the
probe takes a shared lock and drops it at once, so a writer opening at that very instant is
refused as it would be by any other holder (it can simply retry).
"""

from __future__ import annotations

import errno
import fcntl
import os

from ...errors import StoreLockedError

__all__ = ["LOCK_NAME", "acquire_write_lock", "writer_pid"]

LOCK_NAME = "LOCK"
_PID_WIDTH = 20


def acquire_write_lock(store_path: str) -> int:
    """Take the store's write lock and record our pid in it; return the fd that holds it.

    :raises StoreLockedError: another process (or another handle in this one) holds it.
    """
    path = os.path.join(store_path, LOCK_NAME)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = ""
        try:
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
        finally:
            os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            who = f"process {holder}" if holder else "another process"
            if holder == str(os.getpid()):
                who = "this process (another open handle)"
            raise StoreLockedError(f"{store_path} is open for writing by {who}") from None
        raise
    # The pid, padded to a fixed width, overwrites whatever an earlier writer left: no
    # ftruncate, a metadata change that costs milliseconds on some file systems at every open.
    record = f"{os.getpid():<{_PID_WIDTH}}".encode("ascii")
    if os.fstat(fd).st_size > len(record):
        os.ftruncate(fd, 0)  # written by something else: start clean
    os.pwrite(fd, record, 0)
    return fd


def writer_pid(store_path: str) -> str | None:
    """The pid the live writer recorded (``"unknown"`` if none), or None when no process writes."""
    try:
        fd = os.open(os.path.join(store_path, LOCK_NAME), os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
