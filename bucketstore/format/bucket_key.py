"""A bucket's key: the cursor property that names it, spelt as Pulsar spells it (PIP-195)."""

from __future__ import annotations

__all__ = ["BUCKET_KEY_PREFIX", "bucket_key", "parse_bucket_key"]

BUCKET_KEY_PREFIX = "#pulsar.internal.delayed.bucket"


def bucket_key(start_ledger: int, end_ledger: int) -> str:
    """The cursor-property key of a bucket covering ledgers ``[start, end]`` (Pulsar's spelling)."""
    return f"{BUCKET_KEY_PREFIX}_{start_ledger}_{end_ledger}"


def parse_bucket_key(key: str) -> tuple[int, int]:
    """Return ``(start, end)`` of a bucket key; :class:`ValueError` if it is not one."""
    prefix = BUCKET_KEY_PREFIX + "_"
    if not key.startswith(prefix):
        raise ValueError(f"{key!r} is not a bucket key")
    parts = key[len(prefix):].split("_")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        raise ValueError(f"{key!r} is not a bucket key")
    start, end = int(parts[0]), int(parts[1])
    if start > end or end >= 1 << 64:
        raise ValueError(f"{key!r} has an invalid ledger range")
    return start, end
