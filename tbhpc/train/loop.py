"""`tbhpc train RUN`: the GRPO loop, one optimiser update per step, every rank running this file.

    for step s = 1, 2, ...:
      sample from the weights of step s-1 (the verified server version, or the local copy)
      rollouts    ranks claim draws from the shared queue until B mixed groups exist in draw order
      record      attempt rows (shard -> results.duckdb), the episodes token-exact (buffers/step-s.h5)
      update      group-centred advantages, packed micro-batches, PPO-clip token mean, one AdamW step
      checkpoint  DeepSpeed state every checkpoint_every steps (resume from an older one discards, and
                  publishes again, what was published since)
      publish     weights -> the server (broadcast) or checkpoints/step-s (every rank writes), a verified sync
      log         train_steps row + console line (+ TensorBoard)

On USR2/SIGTERM (Slurm's warning before a time limit or preemption) every rank stops at the next
safe point: a step whose rollouts were cut short is abandoned (it is redrawn identically on
resume), a step past its rollouts is finished and checkpointed; then rank 0 requeues the job.
Off-policy (`max_staleness: k` >= 1), the rollouts of steps s+1 .. s+k run in threads during step
s's update and publish, each admitted once the weights it may sample from are served
(train/window.py); `fit` says what that does to determinism and preemption. The parts the loop
drives (engine, rollout context, weight source, step log, ...) are made in build.py; what each
phase writes lives beside it (record.py, steplog.py, publish.py).
"""
from __future__ import annotations

import os
import shutil
import threading
import time

from tbhpc.errors import TbhpcError
from tbhpc.serve.checkpoints import published, version_name
from tbhpc.store.run_dir import RunDir
from tbhpc.train import rft
from tbhpc.train.config import TrainConfig
from tbhpc.train.curriculum import Curriculum, evidence, record_refresh
from tbhpc.train.engine import DistEnv, Engine, UpdateStats
from tbhpc.train.grpo import group_advantages
from tbhpc.train.jobs import end_run, preemption_margin, stop_on_signals
from tbhpc.train.packing import effective_budget, pack
from tbhpc.train.publish import publish, rewind_publications
from tbhpc.train.queue import FLAT, MIXED, DrawQueue
from tbhpc.train.record import record_attempts
from tbhpc.train.rollouts import RolloutContext, StepRollouts, report_progress, run_rank_rollouts
from tbhpc.train.stability import CollapseGuard, RolloutHealth, is_overlong
from tbhpc.train.steplog import StepLog, step_row
from tbhpc.train.watch import Watch, collectives
from tbhpc.train.weights import LocalWeights, ServerWeights
from tbhpc.train.window import Window, admission_version


class Preempted(TbhpcError):
    """A signal asked the trainer to stop; its state is saved."""


def trainable_tokens(cfg: TrainConfig, flash: bool | None = None) -> int:
    """The longest sample the memory plan lets this run train (0: no limit: a CPU run without
    host_memory_gb, or a model whose config.json is not on disk). `flash`: the attention kernel the
    engine got on a GPU (without flash-attn a packed micro-batch pays SDPA's T x T mask)."""
    from tbhpc.plan.memory import plan, plannable
    if not plannable(cfg.model):
        return 0
    return plan(cfg, suggest=False, flash=flash).longest_episode


class Trainer:
    """The step loop over the parts `build.build_trainer` makes from the config (every rank's own)."""

    def __init__(self, cfg: TrainConfig, *, env: DistEnv, eng: Engine, run: RunDir, store, watch: Watch, envs,
                 ctx: RolloutContext, weights: LocalWeights | ServerWeights, curriculum: Curriculum,
                 guard: CollapseGuard, steplog: StepLog, stop: threading.Event, max_train_tokens: int = 0, log=print):
        self.cfg, self.env, self.eng, self.run, self.run_path = cfg, env, eng, run, run.path
        self.store, self.watch, self.envs, self.ctx, self.weights = store, watch, envs, ctx, weights
        self.curriculum, self.guard, self.steplog, self.stop, self.log = curriculum, guard, steplog, stop, log
        self.max_train_tokens = max_train_tokens
        self.rank0 = env.rank == 0
        self.lr_scale, self.stopped = 1.0, ""
        self.elapsed_s = self.spent_s = 0.0      # wall time of the finished steps / up to this step's update (resumes included)
        self.out_of_time = False                 # max_seconds reached: the run ends after this step
        self.margin_warned = False
        self.checkpointed, self.checkpoint_s = 0, 0.0   # the last step saved, and what its save took

    # ---- generation side -------------------------------------------------------------------
    def _rollouts(self, step: int) -> StepRollouts:
        """Step `step`'s rollouts, sampled from the weights of step - 1 - max_staleness (or newer on a
        server: claims start once that version is served). On-policy this runs in the loop;
        off-policy, in a thread during earlier steps' updates (no collectives here: only the draw
        queue's store is shared)."""
        t_start, t0 = time.time(), time.monotonic()
        self.weights.load(admission_version(step, self.cfg.max_staleness))
        sync_s = time.monotonic() - t0
        t1 = time.monotonic()
        queue = DrawQueue(self.store, step, self.cfg.groups_per_step, self.cfg.draw_cap,
                          None if self.cfg.draw_ahead < 0 else self.cfg.draw_ahead)
        done = threading.Event()
        if self.rank0:
            kind = "groups with a pass" if self.cfg.algorithm == "rft" else "mixed groups"
            threading.Thread(target=report_progress, args=(queue, step, self.cfg.groups_per_step, kind, done, t1, self.log),
                             daemon=True).start()
        try:
            outcomes = run_rank_rollouts(self.ctx, queue, step, expected_version=step - 1, stop=self.stop)
        finally:
            done.set()
        return StepRollouts(outcomes, queue, sync_s, time.monotonic() - t1, t_start, time.time())

    # ---- the loop ----------------------------------------------------------------------------
    def fit(self) -> int:
        """Run steps until cfg.steps; returns the last finished step. Raises Preempted on a signal.

        Off-policy (max_staleness k >= 1) the rollouts of steps s+1 .. s+k run in threads while
        step s updates and publishes (train/window.py). Determinism: the in-process generator
        samples step s from exactly step s-1-k's weights, its steps one after another, so a resumed
        run redraws the same rows; a server samples from whatever verified version it holds when
        each turn runs (recorded per token). Decided groups of open steps are kept on disk
        (train/pending.py): a resumed run takes them back instead of drawing them again."""
        stop_on_signals(self.stop, self.env.rank)
        client = self.eng.load(str(self.run_path / "ds_checkpoints"))
        start = int(client["step"]) + 1 if client else 1
        self.checkpointed = start - 1
        if client:
            self._restore_stability(client)
            if self.rank0:
                self.log(f"train: resumed from the DeepSpeed checkpoint of step {start - 1}")
        if self.stopped:
            if self.rank0:
                self.log(f"train: this run was stopped by the collapse guard at step {start - 1} ({self.stopped})")
            return start - 1
        if self.out_of_time:
            if self.rank0:
                self.log(f"train: this run spent its time budget ({self.cfg.max_seconds:g} s) at step {start - 1}")
            return start - 1
        if self.rank0:
            kept = self.ctx.pending.resume(start - 1) if self.ctx.pending else 0
            if kept:
                self.log(f"train: {kept} decided group(s) of the steps after {start - 1} taken back from before the stop")
        rewound = self._rewind_publications(start - 1) if self.rank0 and client else False
        rewound = self.eng.all_reduce([float(rewound)], "max")[0] > 0     # also: every rank sees the pending groups
        last = published(self.run_path, start - 1) if start > 1 else None
        if start > 1 and (rewound or last is None or last.transport == "broadcast"):
            # saved but never published (stopped in between), published since, or broadcast into a server
            # that may have restarted since (it starts from files): publish it again
            self._publish(start - 1)
            if rewound:                       # the server may still serve a discarded step: wait for this one
                self.weights.pin(start - 1)
        k = self.cfg.max_staleness
        window = Window(self._rollouts, self.cfg.steps, serial=not isinstance(self.weights, ServerWeights))
        window.start_at(start)
        window.fill(start + k - 1)
        t_free = time.monotonic()
        try:
            for step in range(start, self.cfg.steps + 1):
                t_wait = time.monotonic()
                self.watch.phase = f"the rollouts of step {step}"
                ro = window.take(step)
                wait_s = time.monotonic() - t_wait
                self.watch.meet(f"rollouts-{step}", f"the rollouts of step {step}")   # bounded: no collective yet
                if self._agree_to_stop():     # also the barrier after which every rank's outcomes are in
                    if step > 1 and self.checkpointed != step - 1:   # checkpoint_every > 1: save what step-1 left
                        self._checkpoint(step - 1)
                    raise Preempted(f"stopped during the rollouts of step {step}; it is redrawn on resume")
                window.fill(step + k)
                with collectives(self.watch, f"the update and publication of step {step}", self.cfg.collective_timeout):
                    self._learn(step, ro, wait_s, t_free)
                t_free = time.monotonic()
                if self.stopped or self.out_of_time:
                    return step
                if self._agree_to_stop():
                    if self.checkpointed != step:     # checkpoint_every > 1: a signal's step is saved all the same
                        self._checkpoint(step)
                    nxt = window.running()
                    later = (f"; the undecided draws of step{'s' if len(nxt) > 1 else ''} "
                             f"{', '.join(map(str, nxt))} are redrawn on resume" if nxt else "")
                    raise Preempted(f"stopped after step {step} (checkpointed){later}")
        finally:
            if window.open:           # stopping (a signal or an error): the threads see the stop event
                self.stop.set()
                window.close()
        return self.cfg.steps

    def fatal(self, line: str) -> None:
        """A peer is lost (train/watch.py): end the run now (jobs.end_run)."""
        end_run(self.watch, self.run_path, line)

    def leave(self, code: int):
        """End this rank's process once its work is written (Engine.leave: no interpreter teardown). The
        watch stops first: rank 0's store goes with rank 0, and that is no longer news."""
        self.watch.stop()
        self.steplog.close()
        self.envs.close()           # tool-server pools, a launched OpenEnv server: no atexit after this
        self.eng.leave(code)

    def _learn(self, step: int, ro: StepRollouts, wait_s: float, t_free: float) -> None:
        """Everything after the rollouts: record, update, checkpoint, publish, log (collective)."""
        cfg = self.cfg
        cutoff = ro.queue.cutoff()      # every rank reported (the loop's _agree_to_stop was a collective)
        if cutoff is None:
            raise TbhpcError(f"step {step}: the rollouts ended undecided (cap {cfg.draw_cap})")
        mine = [g for g in ro.outcomes if g.index <= cutoff and g.status in (MIXED, FLAT)]
        kept = [g for g in mine if g.status == MIXED]
        episodes, adv, filtered = self._advantages(kept)
        episodes, adv, too_long = self._within_plan(step, episodes, adv)
        record_attempts(self.run, cfg, step, mine, self.env.rank, self.env.world)
        refresh = self.curriculum.observe(step, *evidence(mine, self.env.world))   # before the checkpoint that keeps it
        health = RolloutHealth.from_list(self.eng.all_reduce(RolloutHealth.of(r for g in mine for r in g.rollouts).as_list()))
        verdict = self.guard.check(health) if self.guard.active else ""
        if self.guard.active and not verdict:
            self.guard.good = step - 1         # the weights that sampled these rollouts pass
        t_update, t0 = time.time(), time.monotonic()
        action = ""
        if verdict:
            stats, action = self._guard_trips(step, verdict)
        else:
            budget = effective_budget(cfg.microbatch_tokens, [len(e.tokens) for e in episodes],
                                      getattr(self.eng.module.config, "_attn_implementation", None), cfg.sp_size)
            stats = self.eng.update(pack(episodes, adv, budget, seq_weights=cfg.loss_agg == "seq-mean-token-mean",
                                         trained_version=step - 1))
        update_s, t_updated = time.monotonic() - t0, time.time()
        self._check_budget(step, time.monotonic() - t_free)
        t0 = time.monotonic()
        if step % cfg.checkpoint_every == 0 or step == cfg.steps or self.out_of_time:
            self._checkpoint(step)
            self.checkpoint_s = time.monotonic() - t0
        t1 = time.monotonic()
        self._publish(step)
        publish_s = time.monotonic() - t0
        if self.rank0 and not self.margin_warned and os.environ.get("SLURM_JOB_ID") and self.checkpoint_s:
            # a signal's step is checkpointed whatever checkpoint_every says: update + checkpoint + publication
            warning = preemption_margin(cfg.slurm.signal_seconds, update_s, self.checkpoint_s + time.monotonic() - t1)
            if warning:
                self.log(f"train: warning: {warning}")
                self.margin_warned = True
        timings = dict(rollout_s=ro.rollout_s, update_s=update_s, publish_s=publish_s, sync_s=ro.sync_s,
                       step_s=time.monotonic() - t_free, wait_s=wait_s)
        stamps = dict(rollout_start=ro.started, rollout_end=ro.ended, update_start=t_update, update_end=t_updated,
                      published=time.time())
        self.elapsed_s += timings["step_s"]
        row = step_row(cfg, self.env.world, step, ro.outcomes, cutoff, stats, timings, stamps)
        row.update(gen_tokens=health.length, entropy=health.entropy, overlong=health.overlong / max(health.episodes, 1),
                   filtered=int(self.eng.all_reduce([filtered])[0]), too_long=int(self.eng.all_reduce([too_long])[0]),
                   guard=action,
                   lr=cfg.lr * self.lr_scale, pool_version=self.curriculum.version_at(step),
                   pool_size=len(self.ctx.pool_for(step)))
        if self.rank0:
            if refresh:
                self.log(record_refresh(self.run_path, refresh))
            self.steplog.write(row)
            if self.ctx.pending is not None:
                self.ctx.pending.done(step)

    def _advantages(self, kept):
        """The kept groups' samples and advantages (from the shaped rewards); with overlong_filter an
        episode cut off by the response budget stays in its group's baseline but is not trained on.
        Returns (samples, advantages, episodes filtered out). RFT: the passed episodes, weight 1."""
        if self.cfg.algorithm == "rft":
            return rft.samples(kept, self.cfg.overlong_filter, is_overlong)
        episodes, adv, filtered = [], [], 0
        for g in kept:
            a = group_advantages(g.rewards, [g.index] * len(g.rollouts), self.cfg.normalize_std)
            for r, x in zip(g.rollouts, a):
                if self.cfg.overlong_filter and is_overlong(r.episode):
                    filtered += 1
                    continue
                for sample in r.samples:          # several when the chat template rewrote earlier turns
                    sample.advantage = float(x)
                    episodes.append(sample)
                    adv.append(float(x))
        return episodes, adv, filtered

    def _within_plan(self, step: int, episodes, adv):
        """Samples longer than the memory plan's longest trainable episode stay out of the update (they
        are in their group's baseline already): such a sample would run the GPU out of memory. Only on
        GPU runs (a CPU plan has no limit unless host_memory_gb is given); `tbhpc plan` says the limit."""
        limit = self.max_train_tokens
        if not limit or not any(len(e.tokens) > limit for e in episodes):
            return episodes, adv, 0
        keep = [i for i, e in enumerate(episodes) if len(e.tokens) <= limit]
        self.log(f"step {step}: {len(episodes) - len(keep)} sample(s) longer than {limit:,} tokens (the memory plan's "
                 f"longest trainable episode) left out of the update")
        return [episodes[i] for i in keep], [adv[i] for i in keep], len(episodes) - len(keep)

    # ---- the collapse guard ------------------------------------------------------------------
    def _guard_trips(self, step: int, verdict: str):
        """Step `step`'s rollouts left the guard's band, so the weights that sampled them are judged
        bad: restore the DeepSpeed state (weights and optimiser) of the newest step whose weights
        sampled rollouts that passed (`guard.good`, kept by the checkpoint pruning); rollback scales
        the lr and goes on, stop ends the run there. No update this step; the restored weights are
        checkpointed and published as step `step` (a server only moves forward)."""
        stop = self.cfg.guard_action == "stop" or self.guard.rollbacks >= self.cfg.guard_max_rollbacks
        good = self.guard.good
        self.eng.load(str(self.run_path / "ds_checkpoints"), tag=version_name(good))
        self.guard.good = step                 # the same weights, saved again as this step below
        if stop:
            self.stopped = f"step {step}: {verdict}; the weights of step {good} are kept"
        else:
            self.guard.rollbacks += 1
            self.lr_scale *= self.cfg.guard_lr_factor
        self.eng.set_lr(self.cfg.lr * self.lr_scale)
        if self.rank0:
            self.log(f"train: collapse guard at step {step}: {verdict}; " + (
                "stopping with the weights of step " if stop else
                f"rollback {self.guard.rollbacks}/{self.cfg.guard_max_rollbacks} to the weights of step ") +
                f"{good}" + ("" if stop else f", lr now {self.cfg.lr * self.lr_scale:.3g}"))
        return UpdateStats(), "stop" if stop else "rollback"

    def _check_budget(self, step: int, step_so_far: float) -> None:
        """max_seconds: the run ends after the step during which its wall time reached the budget
        (every rank agrees: the largest clock decides); that step is checkpointed and exported."""
        spent = self.spent_s = self.elapsed_s + step_so_far      # saved in the checkpoint (a resume counts on from it)
        if not self.cfg.max_seconds or self.stopped:
            return
        self.out_of_time = bool(self.eng.all_reduce([1.0 if spent >= self.cfg.max_seconds else 0.0], "max")[0])
        if self.out_of_time and self.rank0:
            self.log(f"train: time budget {self.cfg.max_seconds:g} s reached at step {step} ({spent:.0f} s); "
                     f"ending here (of {self.cfg.steps} steps)")

    def _restore_stability(self, client: dict) -> None:
        self.guard.restore(client.get("guard"))
        self.lr_scale, self.stopped = float(client.get("lr_scale", 1.0)), str(client.get("stopped", ""))
        self.elapsed_s = float(client.get("elapsed_s", 0.0))
        self.curriculum.restore(client.get("curriculum"))
        self.out_of_time = bool(self.cfg.max_seconds) and self.elapsed_s >= self.cfg.max_seconds
        if self.lr_scale != 1.0:
            self.eng.set_lr(self.cfg.lr * self.lr_scale)

    def _checkpoint(self, step: int) -> None:
        self.checkpointed = step
        d = self.run_path / "ds_checkpoints"
        self.eng.save(str(d), version_name(step), {"step": step, "seed": self.cfg.seed, "guard": self.guard.state(),
                                                   "lr_scale": self.lr_scale, "stopped": self.stopped,
                                                   "elapsed_s": self.spent_s, "curriculum": self.curriculum.state()})
        if self.rank0:
            tags = sorted(p for p in d.glob("step-*") if p.is_dir())
            for old in tags[:-self.cfg.keep_checkpoints]:
                if not (self.guard.active and old.name == version_name(self.guard.good)):   # the guard's way back
                    shutil.rmtree(old, ignore_errors=True)

    def _publish(self, step: int) -> None:
        publish(self.eng, self.run_path, step, bool(self.stopped or self.out_of_time), self.log)

    def _rewind_publications(self, resumed: int) -> bool:
        return rewind_publications(self.run_path, resumed)

    def _agree_to_stop(self) -> bool:
        return bool(self.eng.all_reduce([1.0 if self.stop.is_set() else 0.0], "max")[0])
