"""The `tbhpc` parser and dispatcher: every command is a module of this package with
`add_parser(sub)` (which sets `func=run`) and `run(args) -> exit code`; `main` parses, calls
`args.func(args)` and turns whatever escapes into one line and an exit code (`failures`).

Building the parser imports nothing heavy: every `tbhpc` call builds every command's parser, so
each command imports what it runs (the campaign runner, DuckDB, torch) inside its `run`.
"""
from __future__ import annotations

import argparse
import os
import sys

from tbhpc import interrupts
from tbhpc.cli import (agg, demo, doctor, episode, export, fields, grad_noise, import_tb, mcp_serve, merge, openenv_serve, plan,
                       probe, report, select, serve, serve_check, show, sql, status, submit, tasks, tracker_sync, train,
                       validate, warmstart)
from tbhpc.cli.failures import exit_code
from tbhpc.interrupts import EXIT_INTERRUPTED

# The order `tbhpc --help` lists them in: the recipe's order, then tools around it.
COMMANDS = (tasks, episode, probe, submit, status, merge, validate, agg, select, report, show, sql, export, import_tb,
            serve, serve_check, train, tracker_sync, plan, fields, doctor, warmstart, grad_noise, openenv_serve, mcp_serve,
            demo)


class Parser(argparse.ArgumentParser):
    """argparse, with its errors on one line like every other tbhpc error (no usage block)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    ap = Parser(prog="tbhpc", description="tbhpc: probe, select, train and evaluate tool-using agents on Slurm.")
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=Parser)
    for command in COMMANDS:
        command.add_parser(sub)
    return ap


def parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """The command line as the command's `run` reads it. `KEY=VALUE` overrides may also follow
    options (`tbhpc eval --out R --workers 2 limit=5`): argparse hands those back as unknown, and
    they join the command's `overrides`; anything else unknown is argparse's one-line error."""
    args, extra = parser.parse_known_args(argv)
    if extra and hasattr(args, "overrides") and all("=" in e and not e.startswith("-") for e in extra):
        args.overrides = list(args.overrides) + extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: list[str] | None = None) -> int:
    interrupts.install()
    try:
        args = parse(build_parser(), argv)
        return args.func(args)
    except (Exception, KeyboardInterrupt) as exc:   # argparse's own exits (errors, --help) pass as they are
        return exit_code(exc)


def entry() -> None:
    """The `tbhpc` command. An interrupted command leaves at once once it has said so (its workers
    are stopped, its results merged): an interpreter shutdown after an interrupt that landed while
    modules imported was seen, about 1 run in 20, to end killed by SIGINT instead of with 130
    (cause not pinned down), and a further Ctrl-C after the report has nothing left to stop."""
    try:
        code = main()
    except KeyboardInterrupt:   # one more Ctrl-C between the report and here
        code = EXIT_INTERRUPTED
    if code == EXIT_INTERRUPTED:
        from tbhpc.interrupts import release_multiprocessing_resources
        release_multiprocessing_resources()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
