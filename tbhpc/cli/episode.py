"""`tbhpc episode --task ID --policy P`: one episode, transcript and grade."""
from __future__ import annotations

import json
import sys

from tbhpc.cli.options import add_agent_flags, non_empty, policy_options


def add_parser(sub) -> None:
    p = sub.add_parser("episode", help="run one episode and print its transcript and grade")
    p.set_defaults(func=run)
    p.add_argument("--task", required=True)
    p.add_argument("--pack", type=non_empty("a pack"), default=None, help="pack file/dir, or tb:DIR (a ThinkingBox data checkout)")
    p.add_argument("--servers", default=None, help="servers file for MCP tool servers (tb: sources)")
    add_agent_flags(p)
    p.add_argument("--format", choices=("text", "json"), default="text")


def run(args) -> int:
    policy_opts = policy_options(args.opt)     # a bad --opt: one line before anything loads
    from tbhpc.agents import build_judge, build_user
    from tbhpc.env.episode import run_episode
    from tbhpc.env.registry import Environments
    from tbhpc.errors import PackError
    from tbhpc.policy import make_policy
    from tbhpc.tasks.loader import load_pack, resolve_pack
    from tbhpc.tb.dataset import TBDataset, is_tb_source
    if is_tb_source(args.pack):
        task = TBDataset(args.pack).tasks([args.task])[0]
    else:
        from tbhpc.tasks.checked import check_pack
        pack = resolve_pack(args.pack)
        tasks = load_pack(pack)
        task = next((t for t in tasks if t.id == args.task), None)
        if task is None:
            raise PackError(str(pack), "no such task", args.task, "id")
        check_pack(pack, tasks)
    envs = Environments(args.servers, announce=True)
    try:
        res = run_episode(task, envs.for_task(task), make_policy(args.policy, **policy_opts),
                          build_user(args), build_judge(args))
    finally:
        envs.close()
    # exit status: 0 when the episode was graded (pass or fail), 1 on a system error (never a grade)
    code = 1 if res.status == "system_error" else 0
    if code:
        print(f"tbhpc: episode {task.id}: system error ({res.error_kind or 'infra'}): {res.error}", file=sys.stderr)
    if args.format == "json":
        print(json.dumps(res.to_dict(), indent=1, ensure_ascii=False))
        return code
    from tbhpc.report.transcript import render_messages, render_outcome
    row = {**(res.grade or {}), "task_id": res.task_id, "attempt_index": 0, "status": res.status,
           "finish_reason": res.finish_reason, "reward": res.reward, "error": res.error, "error_kind": res.error_kind,
           "env_degraded": res.degraded}
    print("\n".join(render_messages(res.messages, show_system=True) + [""] +
                    render_outcome(row, (res.grade or {}).get("rubrics"))))
    return code
