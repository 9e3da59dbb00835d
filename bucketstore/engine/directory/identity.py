"""Does a ledger file belong where the catalog says it does?

A catalog entry says "tracker T's bucket [start, end] is ledger L of store S".
The file ``ledgers/<L>.ledger`` must say the same in its header: ledger id L,
properties ``tracker`` = T, ``store_id`` = S, ``start_ledger``/``end_ledger``
= the key's range. A file swapped with another tracker's, copied from another
store or renamed by hand is intact (every CRC holds) yet would hand the tracker
someone else's positions; this check turns that into an error naming both
sides. Files written before ``store_id`` existed lack it (and maybe
``tracker``): what they do carry is still checked.
"""

from __future__ import annotations

import os
import re

from ...errors import LedgerIdentityError
from ...format.snapshot import BucketFile, parse_bucket_key

__all__ = ["check_identity", "identity_problems"]

_LEDGER_NAME = re.compile(r"^(\d{20})\.ledger$")


def identity_problems(bf: BucketFile, *, ledger_id: int, tracker: str, store_id: str | None,
                      key: str) -> list[str]:
    """What in ``bf``'s header disagrees with the catalog entry (empty when all agrees)."""
    problems = []
    m = _LEDGER_NAME.match(os.path.basename(bf.path))
    if m and int(m.group(1)) != ledger_id:
        problems.append(f"file name says ledger {int(m.group(1))}")
    if bf.ledger_id != ledger_id:
        problems.append(f"header says ledger {bf.ledger_id}")
    props = bf.ledger.properties
    owner = props.get("tracker")
    if owner is not None and owner != tracker:
        problems.append(f"header says tracker {owner!r}")
    owner_store = props.get("store_id")
    if owner_store is not None and store_id is not None and owner_store != store_id:
        problems.append(f"header says store {owner_store}")
    try:
        start, end = parse_bucket_key(key)
    except ValueError:
        start, end = None, None
    held = (bf.metadata.start_ledger, bf.metadata.end_ledger)
    if start is not None and held != (start, end):
        problems.append(f"file holds ledgers [{held[0]}, {held[1]}]")
    return problems


def check_identity(bf: BucketFile, *, ledger_id: int, tracker: str, store_id: str | None, key: str) -> None:
    """Raise :class:`~bucketstore.LedgerIdentityError` naming the catalog entry and the file's header
    when they disagree."""
    problems = identity_problems(bf, ledger_id=ledger_id, tracker=tracker, store_id=store_id, key=key)
    if problems:
        raise LedgerIdentityError(
            f"{bf.path}: catalog entry (tracker {tracker!r}, key {key}, ledger {ledger_id}"
            + (f", store {store_id}" if store_id else "") + f") disagrees with the file: {'; '.join(problems)}",
            path=bf.path, key=key)
