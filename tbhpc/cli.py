"""`tbhpc` command line: thin wrappers over the rooms (tasks, env, policy). No logic lives here
beyond turning flags into objects and results into text or JSON."""
from __future__ import annotations

import os
import signal
import sys


def _interrupted_while_starting(signum, frame) -> None:  # pragma: no cover - a subprocess's first second
    sys.stderr.write("\ntbhpc: interrupted while starting (nothing was run)\n")
    os._exit(130)


# A Ctrl-C while the command's modules still import (up to a second) ends it in one line; main()
# installs the real handler first thing. Only when this process is the `tbhpc` command.
if __name__ == "__main__" or os.path.basename(sys.argv[0] or "") == "tbhpc":
    signal.signal(signal.SIGINT, _interrupted_while_starting)

import argparse  # noqa: E402
import errno  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from tbhpc import interrupts  # noqa: E402
from tbhpc.config import yaml_value  # noqa: E402
from tbhpc.crash import EXIT_INTERNAL, crash_line  # noqa: E402
from tbhpc.errors import TbhpcError, UserError  # noqa: E402
from tbhpc.interrupts import EXIT_INTERRUPTED  # noqa: E402
from tbhpc.outpaths import out_arg  # noqa: E402

# OSErrors that say something about the user's paths or disk, not about tbhpc: one line, exit 2
ENVIRONMENT_ERRNOS = {errno.ENAMETOOLONG, errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT,
                      errno.ENOTDIR, errno.EISDIR, errno.ELOOP}


def _opts(pairs: list[str]) -> dict[str, Any]:
    out = {}
    for p in pairs or []:
        if "=" not in p:
            raise UserError(f"--opt: expected key=value, got {p!r}")
        k, v = p.split("=", 1)
        out[k.strip()] = yaml_value(v, f"--opt {p!r}")
    return out


class Parser(argparse.ArgumentParser):
    """argparse, with its errors on one line like every other tbhpc error (no usage block)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    ap = Parser(prog="tbhpc", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)

    tasks = sub.add_parser("tasks", help="list, show, validate or generate task packs")
    tsub = tasks.add_subparsers(dest="tasks_cmd", required=True)
    for name in ("list", "show", "validate"):
        p = tsub.add_parser(name)
        if name == "show":
            p.add_argument("task_id")
        p.add_argument("pack", nargs="?", default=None, help="pack file or directory, or tb:DIR (default: bundled pack)")
        p.add_argument("--format", choices=("table", "json"), default="table")
        if name == "validate":
            p.add_argument("--servers", default=None, help="tb: sources: also start each scenario's servers, check its "
                                                           "tools and one real __reserved__init")
            p.add_argument("--tasks", type=Path, default=None, help="tb: sources: only the tasks this test list names")
            p.add_argument("--strict", action="store_true", help="tb: sources: a test file tbhpc cannot grade is an "
                                                                 "error (default: skipped, with its reason)")
        if name == "list":
            p.add_argument("--domain")
            p.add_argument("--split", choices=("train", "eval"))
    x = tsub.add_parser("export-tb", help="write built-in tasks as a ThinkingBox data dir served by `tbhpc mcp-serve`")
    x.add_argument("--out", type=out_arg, required=True)
    x.add_argument("--force", action="store_true", help="write into a non-empty folder that is not a previous export")
    x.add_argument("pack", nargs="?", default=None, help="pack file or directory (default: bundled pack)")
    x.add_argument("--domain", action="append", default=[], help="only these domains (repeatable)")
    x.add_argument("--split", choices=("train", "eval", "all"), default="all")
    g = tsub.add_parser("generate", help="regenerate a bundled pack from its templates (or fresh instances: --seed)")
    g.add_argument("--out", type=out_arg, required=True)
    g.add_argument("--force", action="store_true", help="write into a non-empty folder that is not a pack")
    g.add_argument("--pack", choices=("full", "demo"), default="full",
                   help="full: the pack for real models (default); demo: the compact pack sized for the demo model")
    g.add_argument("--seed", type=int, default=None, help="another seed writes fresh instances of the same templates")

    ep = sub.add_parser("episode", help="run one episode and print its transcript and grade")
    ep.add_argument("--task", required=True)
    ep.add_argument("--pack", default=None, help="pack file/dir, or tb:DIR (a ThinkingBox data checkout)")
    ep.add_argument("--servers", default=None, help="servers file for MCP tool servers (tb: sources)")
    add_agent_flags(ep)
    ep.add_argument("--format", choices=("text", "json"), default="text")

    from tbhpc import cli_campaign, cli_results
    cli_campaign.add_parsers(sub)
    cli_results.add_parsers(sub)
    from tbhpc import cli_serve
    cli_serve.add_parsers(sub)
    cli_serve.add_check_parser(sub)
    from tbhpc import cli_train
    cli_train.add_parsers(sub)

    from tbhpc import cli_openenv
    cli_openenv.add_parsers(sub)

    ms = sub.add_parser("mcp-serve", help="serve a built-in domain as a stdio MCP tool server (ThinkingBox reserved tools)")
    ms.add_argument("--domain", required=True, help="retail | insurance | travel | neobank | consulting")

    demo = sub.add_parser("demo", help="the recipe on the bundled pack: the model pipeline, or quick=true for the noisy-oracle check")
    demo.add_argument("--config", type=Path, default=None, help="YAML config (see jobs/demo.yaml)")
    demo.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    return ap


def add_agent_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", default="oracle", help="oracle | noop | openai | hf | tokens")
    p.add_argument("--opt", action="append", default=[], metavar="KEY=VALUE",
                   help="policy option, e.g. endpoint=RUN_DIR, base_url=http://127.0.0.1:8000/v1, model=NAME, model_path=DIR")
    p.add_argument("--user", choices=("scripted", "openai"), default="scripted")
    p.add_argument("--user-url"), p.add_argument("--user-model", default="default")
    p.add_argument("--judge", choices=("keyword", "openai"), default="keyword")
    p.add_argument("--judge-url"), p.add_argument("--judge-model", default="default")


def main(argv: list[str] | None = None) -> int:
    interrupts.install()
    try:
        parser = build_parser()
        args, extra = parser.parse_known_args(argv)
        # key=value overrides may follow options (argparse hands them back as unknown)
        if extra and hasattr(args, "overrides") and all("=" in e and not e.startswith("-") for e in extra):
            args.overrides = list(args.overrides) + extra
        elif extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        if args.cmd == "train":     # the trainer and its in-process generator thread: tbhpc/openmp.py
            from tbhpc.openmp import keep_workers_spinning
            keep_workers_spinning()
        if args.cmd == "tasks":
            from tbhpc import cli_tasks
            return cli_tasks.run(args)
        if args.cmd == "episode":
            from tbhpc import cli_episode
            return cli_episode.run(args, _opts(args.opt))
        if args.cmd in ("probe", "eval", "merge", "validate", "submit", "status"):
            from tbhpc import cli_campaign
            return cli_campaign.run(args)
        if args.cmd in ("agg", "select", "report", "import-tb", "show", "sql", "export"):
            from tbhpc import cli_results
            return cli_results.run(args)
        if args.cmd == "serve":
            from tbhpc import cli_serve
            return cli_serve.run(args)
        if args.cmd == "serve-check":
            from tbhpc import cli_serve
            return cli_serve.run_check(args)
        if args.cmd == "train":
            from tbhpc import cli_train
            return cli_train.run(args)
        if args.cmd == "warmstart":
            from tbhpc import cli_train
            return cli_train.run_warmstart(args)
        if args.cmd == "doctor":
            from tbhpc import cli_train
            return cli_train.run_doctor(args)
        if args.cmd == "plan":
            from tbhpc import cli_train
            return cli_train.run_plan(args)
        if args.cmd == "grad-noise":
            from tbhpc import cli_train
            return cli_train.run_grad_noise(args)
        if args.cmd == "mcp-serve":
            from tbhpc.domains import DOMAIN_NAMES
            if args.domain not in DOMAIN_NAMES:
                raise UserError(f"--domain: unknown domain {args.domain!r} (known: {', '.join(DOMAIN_NAMES)})")
            from tbhpc.env.registry import require_mcp
            from tbhpc.mcp.serve import serve
            require_mcp()
            serve(args.domain)
            return 0
        if args.cmd == "openenv-serve":
            from tbhpc import cli_openenv
            return cli_openenv.run(args)
        if args.cmd == "demo":
            from tbhpc import demo
            return demo.run(args)
    except TbhpcError as exc:
        print(f"tbhpc: error: {exc}", file=sys.stderr)
        return getattr(exc, "exit_code", 2)
    except BrokenPipeError:  # `tbhpc tasks list | head`
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print("\ntbhpc: interrupted (what finished is saved; re-run the same command to resume)", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:  # a bug: one line here, the whole traceback in a file
        if interrupts.pending():  # e.g. DuckDB turns an interrupt into its own InterruptException
            print("\ntbhpc: interrupted (what finished is saved; re-run the same command to resume)", file=sys.stderr)
            return EXIT_INTERRUPTED
        from tbhpc.store.health import damage_error, is_damage
        if is_damage(exc):       # DuckDB found a damaged block in the middle of a command
            print(f"tbhpc: error: {damage_error(exc)}", file=sys.stderr)
            return 2
        if isinstance(exc, OSError) and exc.errno in ENVIRONMENT_ERRNOS:   # the path or the disk, not a bug
            from tbhpc.outpaths import short
            where = f"{short(str(exc.filename))}: " if exc.filename else ""
            print(f"tbhpc: error: {where}{exc.strerror or exc}", file=sys.stderr)
            return 2
        if os.environ.get("TBHPC_TRACEBACK"):
            raise
        print(f"tbhpc: internal error (a bug in tbhpc, not in your input): {crash_line(exc)}", file=sys.stderr)
        return EXIT_INTERNAL
    return 0


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


if __name__ == "__main__":
    entry()
