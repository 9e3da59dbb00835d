"""The ``bucketstore`` command line: look inside ledger files without the engine.

Every command exits 0 on success, 1 when it meets damage (or fails
unexpectedly), 2 on a usage error such as a missing path, and never prints a
traceback. Damage is worded as damage: a typed error of the engine
(:class:`~bucketstore.CatalogError`, :class:`~bucketstore.JournalError`,
:class:`~bucketstore.CorruptLedgerError`) is one line with what it names
(file, offset), an ``OSError`` one line naming its path; only an error of no
known kind is an "unexpected error". Each command is one ``_cmd_*`` function taking the parsed arguments
and returning the exit code, registered by one ``_add_*`` function; a new
command is one more pair.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence

from ..engine.store.checkpoint import check_destination, make_checkpoint
from ..engine.store.upgrade import upgrade_store
from .. import __version__, metrics
from ..errors import BucketStoreError, CatalogError, CorruptLedgerError, JournalError, StoreLockedError
from . import plot, repair
from .dump import describe_file, looks_like_ledger, render_text
from .dump_run import describe_run, looks_like_run, render_run_text
from .progress import Progress
from .simulate import add_arguments, run_from_args
from ..checking import check
from ..checking.ledger_check import ledger_files_under
from ..checking.store_check import NOT_A_STORE, describe_store, is_store

__all__ = ["main", "EXIT_OK", "EXIT_DAMAGE", "EXIT_USAGE"]

EXIT_OK = 0
EXIT_DAMAGE = 1
EXIT_USAGE = 2


class UsageError(Exception):
    """A problem with the command line itself (exit code 2)."""


def _existing_path(path: str) -> str:
    if not path:
        raise UsageError("the path is empty (an unset shell variable?): give a store, a directory or a file")
    if not os.path.exists(path):
        raise UsageError(f"{path}: no such file or directory")
    return path


def _store_path(path: str) -> str:
    _existing_path(path)
    if not is_store(path):
        raise UsageError(f"{path}: {NOT_A_STORE}")
    return path


def _position(position: list[int] | None) -> str:
    """A (ledger, entry) position as ``dump`` prints one (``ledger:entry``), or ``none``."""
    return "none" if position is None else f"{position[0]}:{position[1]}"


def _journal_line(doc: dict) -> str:
    if doc["journal_files"] is None:
        return "journal      none (sealed mode: no journal/ directory)"
    return f"journal      {doc['journal_files']} file(s), {doc['journal_bytes']} bytes"


def _verify_count_line(doc: dict) -> str:
    """Why ``verify``'s "verified N file(s)" differs from the ledger file count above."""
    referenced = len({b["ledger_id"] for t in doc["trackers"].values() for b in t["buckets"]})
    journal = doc["journal_files"] or 0
    return (f"verify       checks {referenced + journal} file(s): {referenced} referenced ledger + {journal} journal; "
            "orphan, temporary and in-flight files are not counted")


def _render_store(doc: dict, *, detail: bool) -> str:
    lines = [f"store        {doc['store']}",
             f"writer       {'process ' + doc['writer_pid'] if doc['writer_pid'] else 'none (not open)'}",
             f"trackers     {len(doc['trackers'])}",
             f"indexes      {doc['indexes']}  (rows in sealed buckets as entry 0 records them, delivered ones included "
             "until their bucket is deleted)",
             f"bytes        {doc['bytes']}" + (f"  ({doc['bytes'] / doc['indexes']:.2f} B/idx)" if doc['indexes'] else ""),
             f"ledger files {doc['ledger_files']} ({len(doc['orphan_files'])} orphan, "
             f"{len(doc['temporary_files'])} temporary, {len(doc['in_flight_files'])} in flight)",
             _journal_line(doc),
             _verify_count_line(doc),
             f"next ledger  {doc['next_ledger_id']}"]
    for name, tracker in doc["trackers"].items():
        lines.append("")
        lines.append(f"tracker {name!r}: {tracker['durability'] or 'sealed'} mode, "
                     f"{len(tracker['buckets'])} bucket(s), {tracker['indexes']} indexes, "
                     f"{tracker['bytes']} bytes, mark-delete {_position(tracker['mark_delete'])}")
        if not detail or not tracker["buckets"]:
            continue
        lines.append(f"  {'ledgers':>23} {'ledger id':>10} {'indexes':>9} {'segs':>5} {'bytes':>9}  "
                     f"{'min_timestamp':>14} {'max_timestamp':>14}")
        for b in tracker["buckets"]:
            rng = f"[{b.get('start_ledger', '?')}, {b.get('end_ledger', '?')}]"
            if "error" in b:
                lines.append(f"  {rng:>23} {b['ledger_id']:>10}  ERROR {b['error']}")
                continue
            if "in_flight" in b:
                lines.append(f"  {rng:>23} {b['ledger_id']:>10}  in flight: {b['in_flight']}")
                continue
            lines.append(f"  {rng:>23} {b['ledger_id']:>10} {b['indexes']:>9} {b['segments']:>5} {b['size']:>9}  "
                         f"{b['min_timestamp'] if b['min_timestamp'] is not None else '-':>14} "
                         f"{b['max_timestamp'] if b['max_timestamp'] is not None else '-':>14}")
    lines += _topic_lines(doc.get("topics") or {})
    return "\n".join(lines)


def _topic_lines(topics: dict) -> list[str]:
    """The topics and, per subscription, what it tracks, holds alone, has due, and its frontier."""
    if "error" in topics:
        return ["", f"topics: ERROR {topics['error']}"]
    lines = []
    for name, topic in topics.items():
        lines += ["", f"topic {name!r}: {topic['rows']} row(s), {len(topic['subscriptions'])} subscription(s), "
                      f"topic index file {topic['file_bytes']} bytes ({topic['live_bytes']} in use), "
                      f"{topic.get('run_files', 0)} sealed run(s) {topic.get('run_bytes', 0)} bytes, "
                      f"cutoff {topic['cutoff']}"]
        for sub, s in topic["subscriptions"].items():
            f = s["frontier"]
            # A frontier at the end of a millisecond (how a subscription starts) shows as its time.
            frontier = "-" if not f else str(f[0]) if f[1] == 2**64 - 1 else f"({f[0]}, {f[1]}:{f[2]})"
            lines.append(f"  subscription {sub!r}: {s['number_of_delayed_messages']} tracked, "
                         f"{s['held_rows']} held alone, {s['due_undelivered']} due and undelivered, "
                         f"frontier {frontier}, mark-delete {_position(s['mark_delete'])}")
    return lines


def _print_store(args: argparse.Namespace, *, detail: bool) -> int:
    doc = describe_store(_store_path(args.store))
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print(_render_store(doc, detail=detail))
    damaged = any("error" in b for t in doc["trackers"].values() for b in t["buckets"]) or \
        "error" in (doc.get("topics") or {})
    return EXIT_DAMAGE if damaged else EXIT_OK


def _cmd_catalog(args: argparse.Namespace) -> int:
    return _print_store(args, detail=True)


def _cmd_stats(args: argparse.Namespace) -> int:
    if args.plot:  # first, so that a missing extra is one line and exit 2, before any output
        _store_path(args.store)
        folder = os.path.dirname(os.path.abspath(args.plot))
        if not os.path.isdir(folder):  # a mistyped output path is the command line's, not damage
            raise UsageError(f"{args.plot}: cannot write the picture there: {folder} is not a directory")
        status = plot.run(args.store, args.plot)
        if status:
            return status
    if args.prometheus:
        doc = describe_store(_store_path(args.store))
        print(metrics.render(metrics.from_description(doc)), end="")
        damaged = any("error" in b for t in doc["trackers"].values() for b in t["buckets"])
        return EXIT_DAMAGE if damaged else EXIT_OK
    return _print_store(args, detail=False)


def _cmd_dump(args: argparse.Namespace) -> int:
    path = _existing_path(args.file)
    if os.path.isdir(path):
        if not is_store(path):
            raise UsageError(f"{path}: {NOT_A_STORE}; dump takes a ledger file, a topic run file or a store")
        args.store = path
        return _print_store(args, detail=True)
    if looks_like_run(path):
        doc, render = describe_run(path, indexes=args.indexes), render_run_text
    elif looks_like_ledger(path):
        doc, render = describe_file(path, indexes=args.indexes), render_text
    else:
        raise UsageError(f"{path}: not a ledger file nor a topic run file (no magic at its start or end); "
                         "dump takes a ledger file, a topic run file or a store")
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print(render(doc))
    return EXIT_OK if doc["error"] is None else EXIT_DAMAGE


def _cmd_verify(args: argparse.Namespace) -> int:
    for path in args.paths:
        _existing_path(path)
        # A directory of ledger files (a store's ledgers/, a backup) is checked file by file;
        # one with neither a store nor a ledger file in it is a wrong path, not "0 files: ok".
        if os.path.isdir(path) and not is_store(path) and not ledger_files_under(path):
            raise UsageError(f"{path}: {NOT_A_STORE}, and holds no *.ledger file")
    # Stores first, then files and directories, as verify has always listed them.
    order = [p for p in args.paths if is_store(p)] + [p for p in args.paths if not is_store(p)]
    # A bar on a terminal only: scripts read verify's stderr, so nothing is added there in a pipe.
    with Progress("verify", None, unit="file", line_when_piped=False) as bar:
        reports = [check(path, on_file=bar.update) for path in order]
    findings = [finding for report in reports for finding in report.findings]
    for finding in findings:
        print(finding)
    damage = [finding for report in reports for finding in report.damage]
    warnings = len(findings) - len(damage)
    summary = (f"{len(damage)} problem(s) in {len({finding.path for finding in damage})} file(s)" if damage
               else "ok")
    if warnings:
        summary += f", {warnings} warning(s)"
    in_flight = sum(r.in_flight for r in reports)
    if in_flight:
        summary += f" ({in_flight} file(s) in flight beside the live writer)"
    print(f"verified {sum(r.files for r in reports)} file(s), {sum(r.segments for r in reports)} segment(s), "
          f"{sum(r.indexes for r in reports)} index(es): " + summary)
    return EXIT_DAMAGE if damage else EXIT_OK


def _cmd_upgrade(args: argparse.Namespace) -> int:
    path = _store_path(args.store)
    try:
        with Progress("upgrade", None, unit="bucket", line_when_piped=False) as bar:
            report = upgrade_store(path, on_bucket=lambda done, total: bar.update(1, total=total))
    except StoreLockedError as exc:
        print(f"bucketstore: {exc}; close it before upgrading", file=sys.stderr)
        return EXIT_DAMAGE
    for failure in report.failed:
        print(f"not upgraded: {failure}")
    saved = (f", {report.bytes_before} -> {report.bytes_after} bytes" if report.upgraded else "")
    print(f"upgraded {report.upgraded} bucket(s){saved}; {report.current} already current; "
          f"{len(report.failed)} failed")
    return EXIT_DAMAGE if report.failed else EXIT_OK


def _cmd_checkpoint(args: argparse.Namespace) -> int:
    source = _store_path(args.store)
    try:
        check_destination(args.dest, source)
        report = make_checkpoint(source, args.dest)
    except ValueError as exc:  # the destination: exists and is not empty, a file, inside the store
        raise UsageError(str(exc)) from None
    print(f"checkpoint {args.dest}: {len(report.trackers)} tracker(s), {report.ledger_files} ledger file(s) "
          f"({report.linked} hard-linked, {report.copied} copied), {report.journal_files} journal file(s)")
    return EXIT_OK


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative")
    return value


def _add_dump(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("dump", help="print a ledger or topic run file's header, entry 0 and segments "
                                         "(or a store overview)",
                            description="Print a ledger file: header, properties and, for a bucket, "
                                        "per segment its timestamps, count, size and ledger bitmaps; or a "
                                        "topic's sealed run file (*.run): header, its ledgers' bitmaps and, "
                                        "per segment, its rows and deliver_at range.")
    p.add_argument("file", metavar="FILE|STORE",
                   help="a ledger file, a topic run file, or a store directory for an overview")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument("--indexes", metavar="N", type=_non_negative, default=0,
                   help="also print the first N indexes of each segment")
    p.set_defaults(run=_cmd_dump)


def _add_verify(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("verify", help="check every CRC, order, bound, bitmap and count",
                            description="Check ledger files completely; a directory means every *.ledger "
                                        "file under it. Prints one line per problem and a summary.")
    p.add_argument("paths", metavar="STORE|FILE|DIR", nargs="+",
                   help="stores (catalog checked against files), ledger files or directories of them")
    p.set_defaults(run=_cmd_verify)


def _add_store_command(commands: argparse._SubParsersAction, name: str, run: Callable[[argparse.Namespace], int],
                       help_text: str) -> argparse.ArgumentParser:
    p = commands.add_parser(name, help=help_text, description=help_text)
    p.add_argument("store", metavar="STORE", help="a store directory")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.set_defaults(run=run)
    return p


def _add_catalog(commands: argparse._SubParsersAction) -> None:
    _add_store_command(commands, "catalog", _cmd_catalog,
                       "list every tracker and its buckets: key range, ledger id, counts, sizes")


def _add_stats(commands: argparse._SubParsersAction) -> None:
    p = _add_store_command(commands, "stats", _cmd_stats, "summarise a store: trackers, indexes, bytes, files")
    p.add_argument("--plot", metavar="PNG", help="also draw what is due when, per bucket, into this PNG "
                                                  "(needs the 'plot' extra: matplotlib)")
    p.add_argument("--prometheus", action="store_true",
                   help="print the on-disk metrics in the Prometheus text format (see bucketstore.metrics)")


def _add_upgrade(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("upgrade", help="rewrite a store's older bucket snapshots in the current format",
                            description="Rewrite every bucket snapshot older than the current format version, "
                                        "in place and crash-safely (new file durable, one catalog commit, "
                                        "old file unlinked). Needs the store closed.")
    p.add_argument("store", metavar="STORE", help="a store directory")
    p.set_defaults(run=_cmd_upgrade)


def _add_checkpoint(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("checkpoint", help="copy a store consistently, even while a writer uses it",
                            description="Copy STORE into DEST (new, or an empty directory) as one consistent "
                                        "state that opens as a store holding everything acknowledged before "
                                        "the command started; the writer keeps working. Ledger files are "
                                        "hard-linked where the file system allows (copied otherwise), the "
                                        "catalog is copied in one read transaction and each journal up to its "
                                        "last commit. DEST appears only once complete.")
    p.add_argument("store", metavar="STORE", help="a store directory (open by a writer or not)")
    p.add_argument("dest", metavar="DEST", help="where the copy goes: a new path or an empty directory")
    p.set_defaults(run=_cmd_checkpoint)


def _add_simulate(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("simulate", help="run a realistic delayed-message workload against a store",
                            description="Producers with random delays, rolling ledgers, a simulated clock, "
                                        "seals, merges and trims, a crash and recovery half way, and every "
                                        "delivery checked against an oracle.")
    add_arguments(p)
    p.set_defaults(run=run_from_args)


def _add_repair(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("repair", help="rebuild a lost or damaged catalog from the store's own files",
                            description="Rebuild catalog/ from the headers of the ledger and journal files "
                                        "(tracker, store, ledger range, segment metadata). Nothing is deleted; "
                                        "mark-delete positions cannot be rebuilt and are reset.")
    repair.add_arguments(p)
    p.set_defaults(run=_checked(repair.run_from_args))


def _checked(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Run a command on a store whose refusals are typed errors: one line naming the reason, exit 1."""
    def wrapped(args: argparse.Namespace) -> int:
        _store_path(args.store)  # before anything is written: never a catalog among a user's files
        try:
            return run(args)
        except (BucketStoreError, OSError, ValueError) as exc:
            print(f"bucketstore: {exc}", file=sys.stderr)
            return EXIT_DAMAGE
    return wrapped


#: The subcommands, in the order ``--help`` lists them.
COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [
    _add_simulate, _add_dump, _add_verify, _add_catalog, _add_stats, _add_checkpoint, _add_repair, _add_upgrade]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every registered subcommand."""
    parser = argparse.ArgumentParser(prog="bucketstore",
                                     description="Run, inspect and verify bucketstore stores and ledger files.")
    parser.add_argument("--version", action="version", version=f"bucketstore {__version__}",
                        help="print the version and exit")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in COMMANDS:
        add(commands)
    return parser


def _damage_kind(exc: BucketStoreError) -> str:
    if isinstance(exc, CorruptLedgerError):
        return "damaged ledger file"
    if isinstance(exc, JournalError):
        return "damaged journal"
    if isinstance(exc, CatalogError):
        return "catalog"
    return type(exc).__name__


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit code (the console script exits with it)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on bad usage and 0 after --help
        return int(exc.code or 0) if not isinstance(exc.code, str) else EXIT_USAGE
    try:
        return args.run(args)
    except UsageError as exc:
        print(f"bucketstore: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        # `bucketstore dump f | head`: the reader left; that is not an error of ours.
        # Point stdout at devnull so the interpreter's final flush cannot raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except KeyboardInterrupt:
        return 130
    except BucketStoreError as exc:
        print(f"bucketstore: {_damage_kind(exc)}: {exc}", file=sys.stderr)
        return EXIT_DAMAGE
    except OSError as exc:
        where = exc.filename if exc.filename is not None else "-"
        print(f"bucketstore: {where}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_DAMAGE
    except Exception as exc:  # the promise is "never a traceback": one line, exit 1
        print(f"bucketstore: unexpected error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_DAMAGE


if __name__ == "__main__":
    sys.exit(main())
