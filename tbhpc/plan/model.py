"""What a GRPO step and an eval campaign cost on a cluster: a small analytic model, pure functions.

Why a model and not a bigger benchmark: the questions people ask before booking 64 x 8 GPUs ("does
one step off-policy pay on our cluster? how many serving nodes per trainer node? how long does the
507 x 20 eval take under fair share?") cannot be measured on 2 cores, but every quantity the answer
depends on can be measured small and scaled by a rule anyone can read:

    rollout   = max(generated tokens / (replicas x decode throughput),    the throughput-bound part
                    longest episode / single-stream speed + turns x env s)  the tail no batching hides
              + prefill tokens / (replicas x prefill throughput)
    update    = trained tokens / (parallel ranks x tokens/s per rank) + per-step fixed cost
    publish   = weights GB / write GB/s + fixed;   sync = weights GB / load GB/s + fixed
    on-policy   step = sync + rollout + update + publish            (each side idles while the other runs)
    off-policy  step = max(rollout_k + sync, update + publish, (tail + sync + update + publish) / (k + 1))
                  rollout_k = max(throughput-bound part, tail / k) + prefill + interrupts   (k = max_staleness)
                  k steps' rollouts are open at once, so the longest episode is shared by k steps; a
                  step is admitted once weights k versions behind it are served (the last term);
                  k = 1 is the one-step-off-policy step, max(rollout + sync, update + publish)
                  interrupts (k >= 2, pause_mode abort): at each sync the turns in flight are
                  issued again: their context prefilled again and half a turn decoded again
                  on shared compute (trainer and server on the same cores: this machine's local
                  cluster) the overlap buys what `overlap` says: 0 (none) unless fitted on a
                  measured on-policy and one-step-off-policy pair (calibrate.overlap_efficiency)
    decode throughput at c episodes in flight = peak x c / (c + c_half)   (batching saturates)
    update fixed cost = fixed + comm x (ranks - 1)                         (ZeRO-3's collectives)

Inputs are dataclasses a YAML file fills (calibrate.py writes them from measured runs; jobs/plan/
holds the named published figures for GPUs). Outputs are seconds, per phase and idle per job.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields


@dataclass
class Workload:
    """One training step's work, from `attempts` and `train_steps` of a measured run (or assumed)."""
    groups: int = 18                    # B informative groups per step
    group_size: int = 8                 # G
    mixed_share: float = 0.5            # share of drawn groups that are informative (zero-variance ones are replaced)
    gen_tokens: float = 64.0            # generated tokens per episode (mean)
    tail_tokens: float = 256.0          # generated tokens of the longest episode of a step (typical)
    context_tokens: float = 1000.0      # tokens per episode the trainer packs (prompt + generations + observations)
    turns: float = 2.0                  # agent turns per episode
    env_s_per_turn: float = 0.0         # tool calls + simulated user per turn (off the server)
    max_draws: int = 0                  # cap on draws per step (0: 4 x B)

    @property
    def draws(self) -> float:
        cap = self.max_draws or 4 * self.groups
        return min(cap, self.groups / max(self.mixed_share, 1e-9))

    @property
    def episodes(self) -> float:
        return self.draws * self.group_size

    @property
    def trained_tokens(self) -> float:
        return min(self.groups, self.draws) * self.group_size * self.context_tokens


@dataclass
class Cluster:
    """Where it runs: trainer ranks, serving replicas, and the rates each achieves."""
    trainer_nodes: int = 1
    ranks_per_node: int = 1             # GPUs per node (CPU nodes: 1)
    parallel_ranks: int = 0             # ranks that really compute at once (0: all; the local cluster shares 2 cores)
    train_tokens_per_s: float = 1000.0  # per rank, forward + backward on packed tokens
    update_fixed_s: float = 0.0         # per step: optimiser step, the packing
    update_comm_s: float = 0.0          # per step and per rank beyond the first: ZeRO-3 gathers and reductions
    replicas: int = 1                   # serving replicas (vLLM servers) of the serving job
    decode_tokens_per_s: float = 100.0  # per replica, aggregate over its concurrent sequences, at saturation
    half_saturation: float = 0.0        # episodes in flight at which a replica makes half of that (0: always all)
    prefill_tokens_per_s: float = 0.0   # per replica (0: prefill folded into decode_tokens_per_s)
    reprefill_tokens_per_s: float = 0.0 # per replica, a re-issued turn's whole context at once after a sync dropped the
                                        # prefix cache (0: prefill_tokens_per_s; both 0: free)
    stream_tokens_per_s: float = 20.0   # one sequence's decode speed at that concurrency
    in_flight: int = 0                  # episodes the trainer keeps in flight (the run's episodes_in_flight; 0: many)
    weights_gb: float = 0.01
    publish_gb_per_s: float = 1.0       # gather + write the published weights
    publish_fixed_s: float = 0.0
    sync_gb_per_s: float = 1.0          # the server's reload
    sync_fixed_s: float = 0.0           # its verification request, announcing the version
    shared_compute: bool = False        # trainer and server share the same cores (this machine's local cluster)
    overlap: float = 1.0                # share of the ideal overlap a run gets (1: dedicated nodes; shared compute: 0
                                        # unless fitted on measured k = 0 and k = 1 runs)

    @property
    def ranks(self) -> int:
        return self.trainer_nodes * self.ranks_per_node


@dataclass
class StepTime:
    rollout_s: float
    update_s: float
    publish_s: float
    sync_s: float
    step_s: float
    trainer_idle_s: float
    server_idle_s: float

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def rollout_parts(w: Workload, c: Cluster) -> tuple[float, float, float]:
    """(throughput-bound, tail, prefill) seconds of one step's rollouts."""
    per_replica = c.in_flight / c.replicas if c.in_flight else float("inf")
    saturation = per_replica / (per_replica + c.half_saturation) if c.half_saturation and c.in_flight else 1.0
    bound = w.episodes * w.gen_tokens / (c.replicas * c.decode_tokens_per_s * saturation)
    tail = w.tail_tokens / c.stream_tokens_per_s + w.turns * w.env_s_per_turn
    prefill = w.episodes * w.context_tokens / (c.replicas * c.prefill_tokens_per_s) if c.prefill_tokens_per_s else 0.0
    return bound, tail, prefill


def phases(w: Workload, c: Cluster) -> tuple[float, float, float, float]:
    """(rollout, update, publish, sync) seconds of one step."""
    bound, tail, prefill = rollout_parts(w, c)
    rollout = max(bound, tail) + prefill
    parallel = min(c.ranks, c.parallel_ranks) if c.parallel_ranks else c.ranks
    update = w.trained_tokens / (parallel * c.train_tokens_per_s) + c.update_fixed_s + c.update_comm_s * (c.ranks - 1)
    publish = c.weights_gb / c.publish_gb_per_s + c.publish_fixed_s
    sync = c.weights_gb / c.sync_gb_per_s + c.sync_fixed_s
    return rollout, update, publish, sync


def interrupt_s(w: Workload, c: Cluster) -> float:
    """Server seconds one sync costs when it aborts the turns in flight (k >= 2): each is issued
    again, its context prefilled again (half an episode's, on average) and half a turn decoded again."""
    in_flight = c.in_flight or w.episodes
    rate = c.reprefill_tokens_per_s or c.prefill_tokens_per_s
    prefill = in_flight * w.context_tokens / 2 / (c.replicas * rate) if rate else 0.0
    redo = in_flight * w.gen_tokens / max(w.turns, 1.0) / 2 / (c.replicas * c.decode_tokens_per_s)
    return prefill + redo


def step_time(w: Workload, c: Cluster, max_staleness: int = 0) -> StepTime:
    """One steady-state step with `max_staleness` k (0: on-policy)."""
    rollout, update, publish, sync = phases(w, c)
    on = sync + rollout + update + publish
    k = max_staleness
    if k == 0:
        step = on
    else:
        bound, tail, prefill = rollout_parts(w, c)
        rollout_k = max(bound, tail / k) + prefill + (interrupt_s(w, c) if k >= 2 else 0.0)
        ideal = max(rollout_k + sync, update + publish, (tail + prefill + sync + update + publish) / (k + 1))
        overlap = 0.0 if c.shared_compute and c.overlap == 1.0 else c.overlap
        step = on - overlap * (on - ideal)
        rollout = rollout_k
    return StepTime(rollout, update, publish, sync, step, max(0.0, step - (update + publish)),
                    max(0.0, step - (rollout + sync)))


def recommended_staleness(w: Workload, c: Cluster, most: int = 8, gain: float = 0.05) -> int:
    """The smallest k past which one more step of staleness saves less than `gain` of the step time:
    staleness costs learning (older tokens, more truncation), so it is bought only while it pays."""
    times = [step_time(w, c, k).step_s for k in range(most + 1)]
    for k in range(most):
        if times[k + 1] > times[k] * (1 - gain):
            return k
    return most


@dataclass
class Campaign:
    """An eval (or probe) campaign as a Slurm array: tasks x repeats over K array tasks."""
    tasks: int = 507
    repeats: int = 20
    array_tasks: int = 32               # K
    workers: int = 8                    # concurrent episodes per array task
    attempt_s: float = 60.0             # one attempt's wall time (mean, from `attempts.wall_s`)
    start_s: float = 5.0                # an array task's start-up (environment, servers' preflight)
    slots: int = 32                     # array tasks the user's fair share lets run at once
    queue_s: float = 1.0                # dispatch latency of one wave (the Slurm bench: submit -> running)
    merge_s: float = 5.0                # the merge job after the array


def campaign_time(c: Campaign) -> dict:
    """Makespan of the campaign: waves of `slots` array tasks, each running its share of attempts."""
    attempts = c.tasks * c.repeats
    per_task = math.ceil(attempts / c.array_tasks)
    task_s = c.start_s + math.ceil(per_task / c.workers) * c.attempt_s
    waves = math.ceil(c.array_tasks / max(1, min(c.slots, c.array_tasks)))
    total = waves * (c.queue_s + task_s) + c.merge_s
    return {"attempts": attempts, "per_array_task": per_task, "waves": waves, "array_task_s": task_s, "total_s": total}
