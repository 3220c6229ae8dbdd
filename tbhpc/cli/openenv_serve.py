"""`tbhpc openenv-serve PACK`: serve a pack's tasks as an OpenEnv environment (tbhpc.openenv.server)."""
from __future__ import annotations

import sys

from tbhpc.cli.options import add_agent_flags, check_listen, host, int_in, non_empty, port, positive
from tbhpc.errors import UserError


def add_parser(sub) -> None:
    p = sub.add_parser("openenv-serve", help="serve a pack's tasks as an OpenEnv environment (reset/step/state, MCP tools)")
    p.set_defaults(func=run)
    p.add_argument("pack", type=non_empty("a pack"), help="pack file/dir, a bundled pack name, or tb:DIR (a ThinkingBox data checkout)")
    p.add_argument("--host", type=host, default="127.0.0.1")
    p.add_argument("--port", type=port, default=8000)
    p.add_argument("--servers", default=None, help="servers file for MCP tool servers (tb: sources)")
    p.add_argument("--tasks", default=None, help="file of task ids to serve (default: every task of the pack)")
    p.add_argument("--max-sessions", type=int_in(1), default=64, help="concurrent sessions (one attempt each)")
    p.add_argument("--tool-timeout", type=positive(86400), default=10.0, help="seconds per tool call before a system error")
    add_agent_flags(p, policy=False)


def run(args) -> int:
    from pathlib import Path

    from tbhpc.agents import build_judge, build_user, check_judge
    from tbhpc.openenv.tasks import load_served_tasks
    from tbhpc.tasks.loader import read_id_list
    check_listen(args.host, args.port)          # before the tasks load and MCP servers start
    ids = read_id_list(Path(args.tasks)) if args.tasks else None
    tasks = load_served_tasks(args.pack, ids)
    check_judge(tasks, args.judge, skip_field=False)
    user, judge = build_user(args), build_judge(args)
    try:
        import uvicorn
        from tbhpc.openenv.server import serve_tasks
    except ImportError as exc:
        raise UserError(f"openenv-serve needs the openenv package ({exc.name} missing): run it from the "
                        "OpenEnv environment (make env-openenv; .venv-openenv/bin/tbhpc openenv-serve ...)") from None
    app, envs = serve_tasks(tasks, args.servers, user, judge, args.tool_timeout, args.max_sessions)
    print(f"tbhpc openenv-serve: {len(tasks)} tasks from {args.pack} on http://{args.host}:{args.port} "
          f"(ws /ws, MCP /mcp; up to {args.max_sessions} sessions)", file=sys.stderr, flush=True)
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    finally:
        envs.close()
    return 0
