"""`tbhpc episode --task ID --policy P`: one episode, transcript and grade."""
from __future__ import annotations

import json
from pathlib import Path

from tbhpc.agents import build_judge, build_user
from tbhpc.env.episode import run_episode
from tbhpc.env.registry import Environments
from tbhpc.errors import PackError
from tbhpc.policy import make_policy
from tbhpc.tasks.loader import load_pack, resolve_pack
from tbhpc.tb.dataset import TBDataset, is_tb_source


def run(args, policy_opts: dict) -> int:
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
    if args.format == "json":
        print(json.dumps(res.to_dict(), indent=1, ensure_ascii=False))
        return 0
    from tbhpc.report.transcript import render_messages, render_outcome
    row = {**(res.grade or {}), "task_id": res.task_id, "attempt_index": 0, "status": res.status,
           "finish_reason": res.finish_reason, "reward": res.reward, "error": res.error, "error_kind": res.error_kind,
           "env_degraded": res.degraded}
    print("\n".join(render_messages(res.messages, show_system=True) + [""] +
                    render_outcome(row, (res.grade or {}).get("rubrics"))))
    return 0
