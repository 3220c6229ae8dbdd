"""Episodes -> training rows: run a group of attempts of one task with the token-exact policy and
turn each into a buffer `Episode` (tokens, loss mask, behaviour logprobs, reward, version).

Rules from the recipe: a system error (backend, tool timeout, endpoint) is re-run, never scored
as 0; every generated token keeps the version of the weights that sampled it (an episode may run
across weight syncs), and the episode's `policy_version` is its oldest (so the trainer can tell
how stale it is); an episode any of whose tokens came from weights the server refused or never
verified raises `UntrustedWeights` (the generator already re-issued turns that weights still
being verified sampled, so this is a refused sync or a server that does not label versions).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from tbhpc.env.episode import EpisodeResult, run_episode
from tbhpc.errors import EndpointError, InfraError
from tbhpc.policy.tokens import TokenPolicy
from tbhpc.rollout.buffer import Episode
from tbhpc.serve.checkpoints import trusted_version, version_step


class UntrustedWeights(EndpointError):
    """Tokens generated under a version that is not `base` or a verified `step-N`
    (`unverified:…` during a sync's check, `rejected:…` after a failed one, `unknown`)."""


@dataclass
class Rollout:
    result: EpisodeResult
    episode: Episode                # the episode's record (its last sample: reward, version, task)
    versions: list[str]
    reruns: int
    earlier: list[Episode] = field(default_factory=list)    # samples closed where the template rewrote earlier turns

    @property
    def samples(self) -> list[Episode]:
        """What the trainer learns from: one sample, or one per template break (same reward)."""
        return self.earlier + [self.episode]


def collect_group(task, domain, policy: TokenPolicy, user, judge, group: int, n: int, seed0: int = 0,
                  max_reruns: int = 3, verify: bool = True) -> list[Rollout]:
    """`n` attempts of one task, one after another (the trainer runs them concurrently through
    `collect_episode`)."""
    return [collect_episode(task, domain, policy, user, judge, group, i, seed0 + i, max_reruns, verify) for i in range(n)]


def collect_episode(task, domain, policy: TokenPolicy, user, judge, group: int, index: int, seed: int,
                    max_reruns: int = 3, verify: bool = True) -> Rollout:
    """Attempt `index` of a group: run it, re-run it on a system error (a fresh sample in the same
    slot, at most `max_reruns` times, then InfraError), check its trace, return it token-exact."""
    reruns = 0
    while True:
        res = run_episode(task, domain, policy, user, judge, seed=seed)
        trace = policy.pop_trace(task.id, seed)
        if res.status == "ok":
            break
        reruns += 1
        if reruns > max_reruns:
            raise InfraError(f"task {task.id} attempt {index}: {reruns} system errors in a row; last: {res.error}")
        seed += 1_000_000   # a fresh sample, same attempt slot
    if verify and policy.check_prefix:
        trace.verify(res.messages)
    samples = trace.samples()
    seen = {v for *_, vs in samples for v in vs if v}
    if untrusted := sorted(v for v in seen if not trusted_version(v)):
        raise UntrustedWeights(f"task {task.id} attempt {index}: sampled by weights the server did not verify "
                               f"({', '.join(untrusted)}); never used for training")
    steps = {v: version_step(v) for v in seen}
    oldest = min(steps.values(), default=0)
    samples = [Episode(t, m, lp, group=group, reward=float(res.reward), task_id=task.id,
                       attempt_key=f"{task.id}#{index}" + (f"/{k}" if k else ""), finish_reason=res.finish_reason,
                       policy_version=oldest, versions=[steps[v] if v else -1 for v in vs],
                       reissued=trace.reissued if k == len(trace.segments) else 0,
                       reprefilled=trace.reprefilled if k == len(trace.segments) else 0)
               for k, (t, m, lp, vs) in enumerate(samples)]
    return Rollout(res, samples[-1], list(trace.turn_versions), reruns, samples[:-1])
