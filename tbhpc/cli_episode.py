"""`tbhpc episode --task ID --policy P`: one episode, transcript and grade."""
from __future__ import annotations

import json
from pathlib import Path

from tbhpc.agents import build_judge, build_user
from tbhpc.env.episode import run_episode
from tbhpc.env.registry import Environments
from tbhpc.errors import PackError
from tbhpc.policy import make_policy
from tbhpc.tasks.loader import default_pack_dir, load_pack
from tbhpc.tb.dataset import TBDataset, is_tb_source


def run(args, policy_opts: dict) -> int:
    if is_tb_source(args.pack):
        task = TBDataset(args.pack).tasks([args.task])[0]
    else:
        pack = Path(args.pack) if args.pack else default_pack_dir()
        task = next((t for t in load_pack(pack) if t.id == args.task), None)
        if task is None:
            raise PackError(str(pack), "no such task", args.task, "id")
    envs = Environments(args.servers, announce=True)
    try:
        res = run_episode(task, envs.for_task(task), make_policy(args.policy, **policy_opts),
                          build_user(args), build_judge(args))
    finally:
        envs.close()
    if args.format == "json":
        print(json.dumps(res.to_dict(), indent=1, ensure_ascii=False))
        return 0
    for m in res.messages:
        role = m["role"].upper()
        if m.get("reasoning"):
            print(f"[{role} reasoning] {m['reasoning']}")
        if m.get("content"):
            print(f"[{role}] {m['content']}")
        for c in m.get("tool_calls", []):
            print(f"[{role} -> {c['function']['name']}] {c['function']['arguments']}")
    print(f"\ntask {res.task_id}: status={res.status} finish={res.finish_reason} reward={res.reward}")
    if res.error:
        print(f"error: {res.error}")
    for line in (res.grade or {}).get("diff", []):
        print(f"  diff: {line}")
    for miss in (res.grade or {}).get("output_missing", []):
        print(f"  missing in final message: {miss!r}")
    for r in (res.grade or {}).get("rubrics", []):
        print(f"  rubric {'YES' if r['yes'] else 'NO '}: {r['question']}")
    return 0
