"""The mark an aborted build leaves so its straggling tasks clean up after themselves.

When a job fails, Spark cancels the other running tasks and calls ``abort``
without waiting for their Python workers to stop; one may still be sealing a
file. ``abort`` therefore first writes ``store/.build-aborted-<job id>``, then
removes the job's files. A task checks the mark before each bucket and after
each seal, and removes what it wrote when it finds it. Whatever the
interleaving, every file is removed by one side: a file renamed before
``abort`` lists the directory is in its listing; one renamed after is seen by
its task together with the mark, which was written before the listing.

Marks are tiny; planning a build removes those older than a day.
"""

from __future__ import annotations

import os
import time

__all__ = ["mark_aborted", "is_aborted", "JobAborted", "remove_stale_marks"]

_PREFIX = ".build-aborted-"
_STALE_SECONDS = 24 * 3600


class JobAborted(RuntimeError):
    """The build this task belongs to was aborted."""


def _mark_path(store: str, job_id: str) -> str:
    return os.path.join(store, _PREFIX + job_id)


def mark_aborted(store: str, job_id: str) -> None:
    fd = os.open(_mark_path(store, job_id), os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def is_aborted(store: str, job_id: str) -> bool:
    return os.path.exists(_mark_path(store, job_id))


def remove_stale_marks(store: str, now: float | None = None) -> None:
    now = time.time() if now is None else now
    for name in os.listdir(store):
        if name.startswith(_PREFIX):
            path = os.path.join(store, name)
            try:
                if now - os.path.getmtime(path) > _STALE_SECONDS:
                    os.unlink(path)
            except FileNotFoundError:
                pass
