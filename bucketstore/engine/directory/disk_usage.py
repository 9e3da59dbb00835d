"""Files and bytes of a live store's directories, counted while its writer changes them.

A seal renames a file into ``ledgers/``; a merge, a delivery, a mark-delete or a ``clear``
unlinks files there; a journal checkpoint replaces a tracker's journal files. None of them
waits for a reader that lists the directory (a metrics scrape, ``Store.stats()``, a
read-only handle, the ``stats`` command in another process), so a listing is already past
when its files are stat'ed one by one. A file the listing names and the stat finds gone was
retired in between: it is left out of both the count and the bytes, as a listing taken a
moment later would have left it out, and counted as ``vanished`` for whoever wants to know.
An absent directory (a tracker deleted meanwhile, a sealed-mode store without
``journal/``) holds nothing. Any other error (permissions, I/O) is no race, and stands.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["DirUsage", "dir_usage", "tree_usage"]


@dataclass(frozen=True, slots=True)
class DirUsage:
    """What a directory held: ``files`` regular files of ``bytes`` bytes in all; ``vanished``
    files were listed but gone before they could be sized (not in ``files`` nor ``bytes``)."""

    files: int = 0
    bytes: int = 0
    vanished: int = 0

    def __add__(self, other: "DirUsage") -> "DirUsage":
        return DirUsage(self.files + other.files, self.bytes + other.bytes, self.vanished + other.vanished)


def dir_usage(directory: str, wanted: Callable[[str], bool] | None = None) -> DirUsage:
    """The regular files directly in ``directory`` whose name ``wanted`` accepts (all when None)."""
    files = size = vanished = 0
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                if wanted is not None and not wanted(entry.name):
                    continue
                try:
                    # DirEntry.is_file() answers from the listing; stat() asks the disk now.
                    if not entry.is_file(follow_symlinks=False):
                        continue
                    size += entry.stat(follow_symlinks=False).st_size
                except FileNotFoundError:
                    vanished += 1
                    continue
                files += 1
    except (FileNotFoundError, NotADirectoryError):
        pass  # the directory itself is gone (or never was one): it holds nothing
    return DirUsage(files, size, vanished)


def tree_usage(root: str, wanted: Callable[[str], bool] | None = None) -> DirUsage:
    """:func:`dir_usage` summed over the subdirectories of ``root`` (one level: ``journal/<tracker>/``)."""
    total = DirUsage()
    try:
        names = os.listdir(root)
    except (FileNotFoundError, NotADirectoryError):
        return total
    for name in names:
        total += dir_usage(os.path.join(root, name), wanted)
    return total
