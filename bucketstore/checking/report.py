"""``bucketstore.check(path)``: check a store, a ledger file or a directory of them, as a library.

What ``bucketstore verify`` prints is this report: one :class:`Finding` per problem and the
counts of what was read. The command line adds only the printing and the exit code.

There is no ``fix=``: checking never writes. What a check reports as a warning (a journal's
torn tail, an orphan or temporary file a crash left) is repaired by the next ``open`` of the
store; a lost or damaged catalog is rebuilt, when asked, by ``bucketstore repair
--rebuild-catalog`` (:func:`bucketstore.engine.store.rebuild.rebuild_catalog`). Damage to a ledger
file's bytes has no repair: its indexes are gone, and only the report says which.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from dataclasses import dataclass

from .ledger_check import FileReport, Finding, check_file as _check_ledger_file, ledger_files_under
from .store_check import NOT_A_STORE, is_store, verify_store

__all__ = ["CheckReport", "Finding", "check", "check_file"]


@dataclass(frozen=True, slots=True)
class CheckReport:
    """What one :func:`check` found, and how much it read.

    :ivar path: what was checked, as given.
    :ivar findings: every problem, in the order found; ``kind`` tells damage from warnings.
    :ivar files: ledger and journal files read completely.
    :ivar segments: bucket segments decoded.
    :ivar indexes: indexes the checked buckets hold (as each bucket's entry 0 records them).
    :ivar in_flight: files a live writer was creating or retiring while they were read:
        counted, not judged (checking beside a writer is allowed).
    """

    path: str
    findings: tuple[Finding, ...] = ()
    files: int = 0
    segments: int = 0
    indexes: int = 0
    in_flight: int = 0

    @property
    def damage(self) -> list[Finding]:
        """The findings that are damage (``verify`` exits 1 on any)."""
        return [f for f in self.findings if f.kind == "damage"]

    @property
    def warnings(self) -> list[Finding]:
        """The findings the next ``open`` repairs by itself."""
        return [f for f in self.findings if f.kind == "warning"]

    @property
    def ok(self) -> bool:
        """True when nothing is damaged (warnings allowed)."""
        return not self.damage


def check(path: str | os.PathLike[str], *, on_file: Callable[[], None] | None = None) -> CheckReport:
    """Check ``path`` completely and report every problem instead of stopping at the first.

    ``path`` is a store (its catalog against every referenced ledger file, every journal
    file, and files a crash left), a ledger file, or a directory holding ``*.ledger``
    files (each checked alone, as a backup of ``ledgers/`` would be). Takes no lock and
    writes nothing, so it runs beside a live writer. Damage never raises: it is a finding.

    :param on_file: called after each ledger file is read (a progress bar's tick).
    :raises FileNotFoundError: ``path`` does not exist.
    :raises ValueError: ``path`` is a directory that is neither a store nor holds any
        ledger file (a wrong path, not "0 files, ok").
    """
    where = os.fspath(path)
    if not os.path.exists(where):
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), where)
    if is_store(where):
        findings, counts = verify_store(where, on_file=on_file)
        return CheckReport(where, tuple(findings), counts["files"], counts["segments"], counts["indexes"],
                           counts["in_flight"])
    if os.path.isdir(where):
        files = ledger_files_under(where)
        if not files:
            raise ValueError(f"{where}: {NOT_A_STORE}, and holds no *.ledger file")
    else:
        files = [where]
    reports = []
    for file in files:
        reports.append(_check_ledger_file(file))
        if on_file is not None:
            on_file()
    return _of_files(where, reports)


def check_file(path: str | os.PathLike[str]) -> CheckReport:
    """Check one ledger file (a bucket, a de-duplicator snapshot) end to end.

    A missing or unreadable file is a finding, not an exception, so that a list of
    files can be checked without a guard around each.

    :raises ValueError: ``path`` is a directory (use :func:`check`).
    """
    where = os.fspath(path)
    if os.path.isdir(where):
        raise ValueError(f"{where}: a directory, not a ledger file; check() takes stores and directories")
    return _of_files(where, [_check_ledger_file(where)])


def _of_files(path: str, reports: list[FileReport]) -> CheckReport:
    return CheckReport(path, tuple(f for r in reports for f in r.findings), len(reports),
                       sum(r.segments for r in reports), sum(r.indexes for r in reports))
