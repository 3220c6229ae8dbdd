"""Episodes -> training rows: run a group of attempts of one task with the token-exact policy and
turn each into a buffer `Episode` (tokens, loss mask, behaviour logprobs, reward, version).

Rules from the recipe: a system error (backend, tool timeout, endpoint) is re-run, never scored
as 0; an episode whose turns came from different weight versions keeps the oldest one as its
`policy_version` (so the trainer can tell how stale it is) and says so in `versions`.
"""
from __future__ import annotations

from dataclasses import dataclass

from tbhpc.env.episode import EpisodeResult, run_episode
from tbhpc.errors import InfraError
from tbhpc.policy.tokens import TokenPolicy
from tbhpc.rollout.buffer import Episode
from tbhpc.serve.supervisor import version_step


@dataclass
class Rollout:
    result: EpisodeResult
    episode: Episode
    versions: list[str]
    reruns: int


def collect_group(task, domain, policy: TokenPolicy, user, judge, group: int, n: int, seed0: int = 0,
                  max_reruns: int = 3, verify: bool = True) -> list[Rollout]:
    out = []
    for i in range(n):
        seed, reruns = seed0 + i, 0
        while True:
            res = run_episode(task, domain, policy, user, judge, seed=seed)
            trace = policy.pop_trace(task.id, seed)
            if res.status == "ok":
                break
            reruns += 1
            if reruns > max_reruns:
                raise InfraError(f"task {task.id} attempt {i}: {reruns} system errors in a row; last: {res.error}")
            seed += 1_000_000   # a fresh sample, same attempt slot
        if verify and policy.check_prefix:
            trace.verify(res.messages)
        steps = [version_step(v.removeprefix("mixed:").split(",")[0]) for v in trace.turn_versions] or [0]
        ep = Episode(trace.tokens, trace.loss_mask, trace.logprobs, group=group, reward=float(res.reward),
                     task_id=task.id, attempt_key=f"{task.id}#{i}", finish_reason=res.finish_reason,
                     policy_version=min(steps))
        out.append(Rollout(res, ep, list(trace.turn_versions), reruns))
    return out
