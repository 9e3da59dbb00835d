"""The ``bucketstore`` command line: look inside ledger files without the engine.

Every command exits 0 on success, 1 when it meets damage (or fails
unexpectedly), 2 on a usage error such as a missing path, and never prints a
traceback. Each command is one ``_cmd_*`` function taking the parsed arguments
and returning the exit code, registered by one ``_add_*`` function; a new
command is one more pair.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence

from .dump import describe_file, render_text
from .verify import verify_paths

__all__ = ["main", "EXIT_OK", "EXIT_DAMAGE", "EXIT_USAGE"]

EXIT_OK = 0
EXIT_DAMAGE = 1
EXIT_USAGE = 2


class UsageError(Exception):
    """A problem with the command line itself (exit code 2)."""


def _existing_path(path: str) -> str:
    if not os.path.exists(path):
        raise UsageError(f"{path}: no such file or directory")
    return path


def _cmd_dump(args: argparse.Namespace) -> int:
    path = _existing_path(args.file)
    if os.path.isdir(path):
        raise UsageError(f"{path}: is a directory; dump takes one ledger file")
    doc = describe_file(path, indexes=args.indexes)
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print(render_text(doc))
    return EXIT_OK if doc["error"] is None else EXIT_DAMAGE


def _cmd_verify(args: argparse.Namespace) -> int:
    for path in args.paths:
        _existing_path(path)
    reports = verify_paths(args.paths)
    problems = 0
    for report in reports:
        for finding in report.findings:
            print(finding)
            problems += 1
    damaged = sum(1 for r in reports if r.findings)
    print(f"verified {len(reports)} file(s), {sum(r.segments for r in reports)} segment(s), "
          f"{sum(r.indexes for r in reports)} index(es): "
          + (f"{problems} problem(s) in {damaged} file(s)" if problems else "ok"))
    return EXIT_DAMAGE if problems else EXIT_OK


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative")
    return value


def _add_dump(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("dump", help="print a ledger file's header, entry 0 and segments",
                            description="Print a ledger file: header, properties and, for a bucket, "
                                        "per segment its timestamps, count, size and ledger bitmaps.")
    p.add_argument("file", metavar="FILE", help="a ledger file")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.add_argument("--indexes", metavar="N", type=_non_negative, default=0,
                   help="also print the first N indexes of each segment")
    p.set_defaults(run=_cmd_dump)


def _add_verify(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("verify", help="check every CRC, order, bound, bitmap and count",
                            description="Check ledger files completely; a directory means every *.ledger "
                                        "file under it. Prints one line per problem and a summary.")
    p.add_argument("paths", metavar="FILE|DIR", nargs="+", help="ledger files or directories")
    p.set_defaults(run=_cmd_verify)


#: The subcommands, in the order ``--help`` lists them.
COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [_add_dump, _add_verify]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every registered subcommand."""
    parser = argparse.ArgumentParser(prog="bucketstore",
                                     description="Inspect bucketstore ledger files and stores.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in COMMANDS:
        add(commands)
    return parser


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
    except Exception as exc:  # the promise is "never a traceback": one line, exit 1
        print(f"bucketstore: unexpected error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_DAMAGE


if __name__ == "__main__":
    sys.exit(main())
