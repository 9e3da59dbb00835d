"""The file layer: every write, fsync, rename, directory fsync and unlink the
engine performs on durable state goes through a :class:`FileSystem`.

Keeping these calls in one place does two jobs. It states the durability
discipline once (a file is durable after ``fsync``; a new name is durable after
the *directory* is fsynced), and it is the seam where the crash-recovery tests
inject faults: a subclass can fail, tear or drop any call.

An ``fsync`` that fails is never retried on the same descriptor: after a failed
fsync the kernel may have dropped the dirty pages and a second fsync can report
success for data that is gone (the "fsyncgate" lesson). Callers treat the file
as poisoned and fail the operation.
"""

from __future__ import annotations

import errno
import os

__all__ = ["FileSystem", "REAL_FS"]


class FileSystem:
    """Real POSIX file operations with the engine's durability discipline."""

    def create(self, path: str) -> int:
        """Create ``path`` exclusively for writing and return its descriptor."""
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)

    def open_append(self, path: str) -> int:
        """Open (creating if needed) ``path`` for appending and return its descriptor."""
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0), 0o644)

    def write(self, fd: int, data: bytes | bytearray | memoryview) -> None:
        """Write all of ``data``; a short write is continued, never silently accepted."""
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            if n <= 0:  # pragma: no cover - os.write raises rather than returning 0 on a regular file
                raise OSError(errno.EIO, "write returned no progress")
            view = view[n:]

    def fsync(self, fd: int) -> None:
        """Make the file's data and metadata durable."""
        os.fsync(fd)

    def truncate(self, fd: int, length: int) -> None:
        """Cut the file to ``length`` bytes (used to drop a torn journal tail)."""
        os.ftruncate(fd, length)

    def close(self, fd: int) -> None:
        os.close(fd)

    def open_read(self, path: str) -> int:
        """Open ``path`` for reading and return its descriptor (a ledger reader's).

        Reads change nothing durable; they pass through the file layer only so that a
        test can fail them (EMFILE, EIO) where the engine reads a sealed bucket."""
        return os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))

    def pread(self, fd: int, length: int, offset: int) -> bytes:
        """Read up to ``length`` bytes at ``offset`` (thread-safe: no file position)."""
        return os.pread(fd, length, offset)

    def rename(self, src: str, dst: str) -> None:
        """Atomically replace ``dst`` by ``src`` (same directory); durable only after :meth:`fsync_dir`."""
        os.rename(src, dst)

    def unlink(self, path: str) -> None:
        """Remove ``path``; durable only after :meth:`fsync_dir` of its directory."""
        os.unlink(path)

    def fsync_dir(self, path: str) -> None:
        """Make the directory's entries (creations, renames, unlinks) durable."""
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def makedirs(self, path: str) -> None:
        """Create ``path`` (and parents) if missing, and make the new entries durable."""
        missing = []
        p = os.path.abspath(path)
        while not os.path.isdir(p):
            missing.append(p)
            p = os.path.dirname(p)
        for d in reversed(missing):
            try:
                os.mkdir(d, 0o755)
            except FileExistsError:
                pass
            self.fsync_dir(os.path.dirname(d))


#: The process-wide real file system. Tests substitute a fault-injecting subclass.
REAL_FS = FileSystem()
