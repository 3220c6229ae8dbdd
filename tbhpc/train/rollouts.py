"""One rank's part of a step's rollouts: claim draws, run each draw's G episodes concurrently
against the generator, grade them, and report whether the group is informative (on the rewards
the advantages will see: the grades with the overlong shaping, against the variance floor).

Why two pools: the server batches concurrent requests (vLLM-CPU does 2.2x the tokens/s at 32 in
flight), so the unit of concurrency is the episode; groups are claimed one per group thread and
fan their episodes out to a shared episode pool of `episodes_in_flight` slots. A group whose
episodes hit a system error re-runs them (`collect_episode`, bounded); a group that still cannot
be completed is DROPPED, never scored. A group claimed past the step's cutoff stops between
episodes (surplus). Tokens from weights older than the staleness bound are not trained on: that
group is dropped and counted (admission, train/window.py, keeps this from happening).

Off-policy, several steps' rollouts run at once on a rank; they share its episode slots
(`EpisodeSlots`), the earliest step first, since the trainer waits for it next.
"""
from __future__ import annotations

import itertools
import math
import queue as queues
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, Future, wait
from dataclasses import dataclass, field

from tbhpc.errors import InfraError
from tbhpc.rollout.collect import Rollout, collect_episode
from tbhpc.train import rft
from tbhpc.train.draw import draw, episode_seed
from tbhpc.train.grpo import is_informative
from tbhpc.train.queue import DROPPED, FLAT, MIXED, DrawQueue
from tbhpc.train.stability import shaped_rewards

SURPLUS = "surplus"
_SLOTS_LOCK = threading.Lock()


@dataclass
class GroupOutcome:
    index: int                   # draw index within the step
    task_id: str
    status: str                  # mixed | flat | dropped | surplus
    rollouts: list[Rollout] = field(default_factory=list)
    reruns: int = 0              # system errors cured by re-running an episode
    error: str = ""
    seconds: float = 0.0
    rewards: list[float] = field(default_factory=list)   # what the advantages see: the grades, shaped (stability.py)
    resumed: bool = False        # taken back from before a preemption (train/pending.py), not run again


@dataclass
class RolloutContext:
    """Everything a rank needs to run episodes; built once per trainer process."""
    pool: list[str]
    tasks: dict                  # task id -> Task
    env_of: object               # callable: Task -> Environment (built-in domain or MCP servers)
    policy: object               # TokenPolicy
    user: object
    judge: object
    group_size: int
    seed: int
    max_reruns: int = 3
    episodes_in_flight: int = 32
    max_staleness: int = 0       # on-policy: every token from the step's own weights
    overlong: tuple[int, int, float] = (0, 0, 0.0)   # (response budget, buffer, penalty): stability.shaped_rewards
    min_group_std: float = 0.0   # a group below this reward std is flat (replaced)
    algorithm: str = "grpo"      # rft: a group is kept when one of its checks passed (train/rft.py)
    pool_at: object = None       # step -> the pool its draws use (train/curriculum.py); None: `pool` throughout
    pending: object = None       # PendingGroups: decided groups kept across a preemption (train/pending.py)
    slots: object = None         # EpisodeSlots shared by every open step (made on first use)

    def pool_for(self, step: int) -> list[str]:
        return self.pool if self.pool_at is None else self.pool_at(step)

    def episode_slots(self) -> "EpisodeSlots":
        with _SLOTS_LOCK:           # the first open steps ask at once
            if self.slots is None:
                self.slots = EpisodeSlots(self.episodes_in_flight)
            return self.slots


class EpisodeSlots:
    """A rank's episode threads (`n`), shared by the steps whose rollouts are open: a waiting
    episode of an earlier step runs before one of a later step, then by draw order. Threads are
    daemons that live as long as the trainer process."""

    def __init__(self, n: int):
        self.jobs: queues.PriorityQueue = queues.PriorityQueue()
        self.order = itertools.count()
        for k in range(max(1, n)):
            threading.Thread(target=self._work, name=f"episode-{k}", daemon=True).start()

    def submit(self, priority: tuple, fn, *args) -> Future:
        f: Future = Future()
        self.jobs.put((priority, next(self.order), f, fn, args))
        return f

    def _work(self) -> None:
        while True:
            _, _, f, fn, args = self.jobs.get()
            if not f.set_running_or_notify_cancel():
                continue
            try:
                f.set_result(fn(*args))
            except BaseException as exc:    # handed to whoever waits on the future
                f.set_exception(exc)


def run_rank_rollouts(ctx: RolloutContext, queue: DrawQueue, step: int, expected_version: int,
                      stop: threading.Event | None = None) -> list[GroupOutcome]:
    """Claim and run groups until the step is decided; returns this rank's outcomes."""
    stop = stop or threading.Event()
    out: list[GroupOutcome] = []
    lock = threading.Lock()
    group_threads = max(1, math.ceil(ctx.episodes_in_flight / ctx.group_size))
    errors: list[BaseException] = []
    episodes = ctx.episode_slots()

    def worker() -> None:
        try:
            while not stop.is_set() and (i := queue.claim()) is not None:
                g = _run_group(ctx, episodes, queue, step, i, expected_version, stop)
                if g.status == SURPLUS:
                    queue.release(i)
                else:
                    if ctx.pending is not None and not g.resumed:
                        ctx.pending.save(step, g)      # before it is reported: a stop from here on keeps it
                    queue.report(i, g.status)
                with lock:
                    out.append(g)
                queue.cutoff()    # decide as soon as the outcomes allow: other workers stop claiming
        except BaseException as exc:   # a bug or a refused template: stop everyone, re-raise below
            errors.append(exc)
            stop.set()
        if stop.is_set():
            queue.abort()     # a signal (or an error) here stops every rank's claims
    threads = [threading.Thread(target=worker, name=f"group-{step}-{k}") for k in range(group_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return sorted(out, key=lambda g: g.index)


def _run_group(ctx: RolloutContext, episodes: EpisodeSlots, queue: DrawQueue, step: int, index: int,
               expected_version: int, stop: threading.Event) -> GroupOutcome:
    if ctx.pending is not None and (kept := ctx.pending.load(step, index)) is not None:
        kept.resumed = True          # decided before a preemption: its rows as they were sampled
        return kept
    t0 = time.monotonic()
    task = ctx.tasks[draw(ctx.pool_for(step), ctx.seed, step, index)]
    domain = ctx.env_of(task)
    base = episode_seed(ctx.seed, step, index)

    def one(k: int) -> Rollout | None:
        if stop.is_set() or queue.surplus(index):
            return None
        return collect_episode(task, domain, ctx.policy, ctx.user, ctx.judge, group=index, index=k, seed=base + k,
                               max_reruns=ctx.max_reruns)

    futures = [episodes.submit((step, index, k), one, k) for k in range(ctx.group_size)]
    done, pending = wait(futures, return_when=FIRST_EXCEPTION)
    for f in pending:
        f.cancel()
    g = GroupOutcome(index, task.id, DROPPED)
    failed = next((f.exception() for f in done if f.exception() is not None), None)
    if failed is not None:
        wait(pending)
        if not isinstance(failed, InfraError):     # a bug or a broken template: stop the run, loudly
            raise failed
        g.error, g.seconds = f"{type(failed).__name__}: {failed}", time.monotonic() - t0
        return g      # could not complete this group: dropped, never scored
    rollouts = [f.result() for f in futures]
    g.seconds = time.monotonic() - t0
    if any(r is None for r in rollouts):
        g.status = SURPLUS
        return g
    g.rollouts, g.reruns = rollouts, sum(r.reruns for r in rollouts)
    oldest = min(s.policy_version for r in rollouts for s in r.samples)
    if expected_version - oldest > ctx.max_staleness:
        g.error = f"sampled by step {oldest}, expected step {expected_version} (staleness bound {ctx.max_staleness})"
        return g
    g.rewards = shaped_rewards(rollouts, *ctx.overlong)
    kept = rft.keeps(rollouts) if ctx.algorithm == "rft" else is_informative(g.rewards, ctx.min_group_std)
    g.status = MIXED if kept else FLAT
    return g


@dataclass
class StepRollouts:
    """One step's rollouts on this rank, and when they ran."""
    outcomes: list
    queue: DrawQueue            # its cutoff is read once every rank's rollouts ended (after a collective)
    sync_s: float               # waiting for the sampling weights
    rollout_s: float
    started: float              # wall clock (time.time()) of the wait for weights, and of the last outcome
    ended: float


def report_progress(queue: DrawQueue, step: int, need: int, kind: str, done: threading.Event, t0: float, log,
                    every_s: float = 10.0) -> None:
    """A progress line every `every_s` until `done` while a step's rollouts run (they can take
    minutes): draws claimed, and of the `need` groups the step keeps (`kind`), how many are in."""
    while not done.wait(every_s):
        claimed, kept = queue.progress()
        log(f"step {step:>4} rollouts: {claimed} drawn, {kept}/{need} {kind}, {time.monotonic() - t0:.0f} s")
