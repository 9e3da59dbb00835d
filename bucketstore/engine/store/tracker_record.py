"""What a tracker's catalog state records about how it was written: its durability and its config.

A writable open and a read-only open both start from these two facts, so they live
here, beside the store handles that use them:

- **durability.** A tracker records the mode it was last opened for writing in
  (``"durability"`` in its state, written at open). Trackers written before the
  mode was recorded are judged by their files: a journal directory holding journal
  files means ``"journal"`` (every journal open leaves one), none means unknown.
  A journal tracker asked for by a sealed store is refused
  (:class:`~bucketstore.DurabilityMismatchError`) while its journal holds anything:
  acknowledged indexes a sealed open would not see, and state that would contradict
  any change made there at the next journal open. (An empty journal hides nothing:
  the tracker then opens sealed, and is recorded so.) A sealed tracker
  opened in journal mode becomes a journal tracker: the stronger promise, and a
  safe one (no frontier yet, so every sealed row is delivered; nothing is skipped).
- **config.** Without an explicit ``config``, a tracker is opened with the one it
  recorded, not the defaults.
"""

from __future__ import annotations

import os
from typing import Any

from ...config import TrackerConfig, config_from_record
from ...errors import DurabilityMismatchError, JournalError
from ..durability.journal import journal_directory, list_files, read_journal

__all__ = ["recorded_durability", "check_durability", "recorded_config"]


def recorded_durability(state: dict[str, Any] | None, store_path: str, name: str) -> str | None:
    """The durability tracker ``name`` was written in: the one its state records, else
    ``"journal"`` when its journal directory holds journal files, else None (a new tracker,
    or one written in sealed mode before the mode was recorded)."""
    if state is not None and state.get("durability") in ("sealed", "journal"):
        return str(state["durability"])
    if state is None:
        return None  # files under a name the catalog does not know are a deleted tracker's
    directory = journal_directory(store_path, name)
    try:
        return "journal" if list_files(directory)[0] else None
    except (FileNotFoundError, NotADirectoryError):
        return None


def check_durability(state: dict[str, Any] | None, store_path: str, name: str, requested: str) -> None:
    """Refuse to open a journal tracker in sealed mode when its journal holds anything.

    A journal holding no record and no delivery frontier (a journal open that only looked,
    as a newcomer's ``bucketstore.open(path)`` of the sealed demo store does) hides nothing:
    the sealed open goes ahead and records sealed, and the next journal open removes those
    files unread. A journal that cannot be read is taken to hold something.

    :raises DurabilityMismatchError: the tracker was written in journal mode, its journal
        holds indexes, untracks or a frontier, and the store is open in sealed mode; nothing
        has been changed.
    """
    recorded = recorded_durability(state, store_path, name)
    if requested == "sealed" and recorded == "journal" and not _journal_is_empty(store_path, name):
        raise DurabilityMismatchError(
            f"tracker {name!r} of store {os.path.abspath(store_path)} was written with durability=\"journal\": its "
            "journal holds acknowledged indexes or a delivery frontier, which a sealed open would not see; "
            f"open the store with bucketstore.open({os.path.abspath(store_path)!r}, durability=\"journal\") "
            "(nothing was changed)",
            tracker=name, recorded=recorded, requested=requested)


def _journal_is_empty(store_path: str, name: str) -> bool:
    try:
        replayed = read_journal(store_path, name)
    except (JournalError, OSError):
        return False
    return replayed is None or (not replayed.records and replayed.frontier is None)


def recorded_config(state: dict[str, Any] | None) -> TrackerConfig:
    """The configuration recorded in a tracker's state (see :func:`~bucketstore.config.config_from_record`)."""
    return config_from_record((state or {}).get("config"))
