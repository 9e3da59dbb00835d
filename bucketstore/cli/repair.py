"""``bucketstore repair --rebuild-catalog STORE``: rebuild a lost catalog from the files."""

from __future__ import annotations

import argparse

from ..engine.store.rebuild import NothingToRebuild, rebuild_catalog

__all__ = ["add_arguments", "run_from_args"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("store", metavar="STORE", help="a store directory (not open for writing)")
    p.add_argument("--rebuild-catalog", action="store_true", required=True,
                   help="rebuild catalog/ from the ledger and journal files' headers; the old catalog is "
                        "renamed aside and no file is deleted")
    p.add_argument("--force", action="store_true",
                   help="rebuild even if the current catalog is healthy (every mark-delete position is reset)")


def run_from_args(args: argparse.Namespace) -> int:
    """Rebuild and print what was done; 0 when rebuilt or nothing needed rebuilding, 1 when
    refused (the reason on one line)."""
    try:
        report = rebuild_catalog(args.store, force=args.force)
    except NothingToRebuild as exc:
        # A healthy catalog is the good outcome of a check, not a failure: scripts that run
        # repair after every incident must not page anyone for it.
        print(f"nothing to rebuild: {exc.path} opens and belongs to the store's files "
              "(--force rebuilds anyway, resetting every mark-delete position)")
        return 0
    if report.old_catalog:
        print(f"old catalog kept as {report.old_catalog}")
    for line in report.superseded:
        print(f"superseded: {line}")
    for line in report.unreadable:
        print(f"not registered: {line}")
    buckets = sum(report.trackers.values())
    print(f"rebuilt catalog of store {report.store_id}: {len(report.trackers)} tracker(s), {buckets} bucket(s), "
          f"next ledger id {report.next_ledger_id}; mark-delete positions cannot be rebuilt and were reset")
    return 0
