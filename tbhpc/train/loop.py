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
One step off-policy (`max_staleness: 1`), the rollouts of step s+1 run in a thread during step s's
update and publish, from step s-1's weights (or newer, on a server); `fit` says what that does to
determinism and preemption.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

from tbhpc.errors import TbhpcError, UserError
from tbhpc.serve.checkpoints import BASE_VERSION, published, version_name
from tbhpc.train.config import TrainConfig
from tbhpc.train.curriculum import Curriculum, evidence, record_refresh
from tbhpc.train.draw import load_pool
from tbhpc.train.engine import DistEnv, Engine
from tbhpc.train.jobs import preemption_margin, start_export_eval, stop_serving_job
from tbhpc.train import rft
from tbhpc.train.grpo import group_advantages
from tbhpc.train.packing import effective_budget, pack
from tbhpc.train.queue import DROPPED, FLAT, MIXED, DrawQueue, make_store
from tbhpc.train.record import open_train_run, record_step, step_line
from tbhpc.train.rollouts import Ahead, RolloutContext, StepRollouts, run_rank_rollouts
from tbhpc.train.stability import CollapseGuard, RolloutHealth, is_overlong
from tbhpc.train.watch import Watch, collectives



class Preempted(TbhpcError):
    """A signal asked the trainer to stop; its state is saved."""


def version_of(step: int) -> str:
    return BASE_VERSION if step == 0 else version_name(step)


def attempt_index(cfg: TrainConfig, step: int, draw: int, k: int) -> int:
    """A rollout's attempt index, unique in the run: off-policy two steps can be sampled by the same
    weights (the attempt key's policy_id), so the index counts across steps, not within one."""
    return ((step - 1) * cfg.draw_cap + draw) * cfg.group_size + k


def _utc(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).replace(tzinfo=None).isoformat(sep=" ")


def trainable_tokens(cfg: TrainConfig) -> int:
    """The longest sample the memory plan lets this run train (0: no limit: a CPU run without
    host_memory_gb, or a model whose config.json is not on disk)."""
    from tbhpc.plan.memory import plan, plannable
    if not plannable(cfg.model):
        return 0
    return plan(cfg, suggest=False).longest_episode


class Trainer:
    def __init__(self, cfg: TrainConfig, run_path: Path, env: DistEnv | None = None, log=print):
        cfg.validate()
        self.cfg, self.env, self.log = cfg, env or DistEnv.from_environ(), log
        self.rank0 = self.env.rank == 0
        self.stop = threading.Event()
        from tbhpc.campaign.config import CampaignConfig, select_tasks
        pool = load_pool(cfg.pool, cfg.exclude)
        candidates = load_pool(cfg.refresh_pool, cfg.exclude) if cfg.refresh_pool else []
        tasks = {t.id: t for f in [cfg.pool] + ([cfg.refresh_pool] if candidates else [])
                 for t in select_tasks(CampaignConfig(pack=cfg.pack, tasks=f, split="all", servers=cfg.servers))}
        tasks = list(tasks.values())
        self.curriculum = Curriculum(pool, candidates, cfg.seed, cfg.refresh_below, cfg.refresh_window, 2 * cfg.group_size,
                                     cfg.refresh_size, cfg.max_staleness)
        from tbhpc.agents import check_judge
        from tbhpc.env.registry import Environments, preflight
        from tbhpc.openenv.launch import openenv_spec
        check_judge(tasks, cfg.judge, skip_field=False)
        if self.rank0:
            preflight(tasks, cfg.servers, openenv_spec(cfg.environment, cfg.openenv, 'train config'))
        self.run_path = Path(run_path).resolve()
        self.eng = Engine(cfg, self.env)
        self.max_train_tokens = trainable_tokens(cfg)
        if self.rank0:
            open_train_run(cfg, self.run_path, tasks)     # creates it, or checks a resumed one is the same run
        self.eng.barrier()
        from tbhpc.store.run_dir import RunDir
        self.run = RunDir(self.run_path).require()
        self.store = make_store(self.env.rank, self.env.world, self.env.master_addr, self.env.master_port + 1)
        self.watch = Watch(self.store, self.env.rank, self.env.world, cfg.silence_timeout, cfg.collective_timeout,
                           "collective_timeout_s", on_fatal=self.fatal).start()
        self.envs = Environments(cfg.servers, openenv=openenv_spec(cfg.environment, cfg.openenv, 'train config'))
        self.ctx = RolloutContext(pool, {t.id: t for t in tasks}, self.envs.for_task, self._policy(), *_user_judge(cfg),
                                  group_size=cfg.group_size, seed=cfg.seed, max_reruns=cfg.max_reruns,
                                  max_staleness=cfg.max_staleness, episodes_in_flight=cfg.in_flight_per_rank(self.env.world) if cfg.generator != "local" else 1,
                                  overlong=(cfg.response_budget, cfg.overlong_buffer, cfg.overlong_penalty),
                                  min_group_std=cfg.min_group_std, algorithm=cfg.algorithm,
                                  pool_at=self.curriculum.pool_at)
        self.guard = CollapseGuard(cfg.guard_length, cfg.guard_entropy, cfg.guard_window, cfg.guard_reference or None)
        self.lr_scale, self.stopped = 1.0, ""
        self.elapsed_s = self.spent_s = 0.0      # wall time of the finished steps / up to this step's update (resumes included)
        self.out_of_time = False                 # max_seconds reached: the run ends after this step
        self.tb = _tensorboard(self.run_path) if cfg.tensorboard and self.rank0 else None
        self.margin_warned = False
        self.checkpointed, self.checkpoint_s = 0, 0.0   # the last step saved, and what its save took
        self.exact_version: int | None = None     # after a rewind: the first rollouts wait for this version only

    # ---- generation side -------------------------------------------------------------------
    def _policy(self):
        from tbhpc.policy.tokens import TokenPolicy
        c = self.cfg
        return TokenPolicy(model_path=c.model, generator=c.generator, endpoint=str(self.run_path), temperature=c.temperature,
                           top_k=c.top_k, top_p=c.top_p, max_tokens=c.max_tokens, response_budget=c.response_budget,
                           max_context=c.max_context, seed=c.seed, threads=c.torch_threads, timeout_s=c.request_timeout_s)

    def _sampling_weights(self, version: int) -> float:
        """Make the generator sample from step `version`'s weights (a server: that version or a newer
        verified one); returns the seconds spent waiting. A signal ends a server's wait early: the
        rollouts that follow then claim nothing and the loop stops at its next safe point."""
        t0, want = time.monotonic(), version_of(version)
        if self.cfg.generator == "server":
            from tbhpc.serve.endpoint import wait_for_version
            exact, self.exact_version = self.exact_version, None
            if exact is not None:
                want = version_of(exact)
            wait_for_version(self.run_path, want, timeout_s=self.cfg.sync_timeout_s,
                             or_newer=self.cfg.max_staleness > 0 and exact is None, stop=self.stop)
        else:
            import torch
            from transformers import AutoModelForCausalLM

            from tbhpc.policy.generation import LocalGenerator
            # the published copy (not this process's module): exactly the weights a server would load
            pub = published(self.run_path, version) if version else None
            if pub is not None and pub.weights == "adapter":
                from tbhpc.train.lora import load_adapted
                model = load_adapted(self.cfg.model, str(pub.path)).eval()
            else:
                path = str(pub.path) if pub is not None else self.cfg.model
                model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
            old = self.ctx.policy._engine[1] if self.ctx.policy._engine else None
            if self.cfg.generator == "batched" and old is not None:
                old.load_weights(model, want)
                return time.monotonic() - t0
            if self.cfg.generator == "batched":
                from tbhpc.policy.batched import BatchedGenerator
                gen = BatchedGenerator(model, self.eng.tokenizer.eos_token_id, version=want)
            else:
                gen = LocalGenerator.for_tokenizer(model, self.eng.tokenizer)
                gen.version = want
            self.ctx.policy._engine = (self.eng.tokenizer, gen)
        return time.monotonic() - t0

    def _rollouts(self, step: int) -> StepRollouts:
        """Step `step`'s rollouts, sampled from the weights of step - 1 - max_staleness (or newer on a
        server). On-policy this runs in the loop; one step off-policy, in a thread during the
        previous step's update (no collectives here: only the draw queue's store is shared)."""
        t_start = time.time()
        sync_s = self._sampling_weights(max(0, step - 1 - self.cfg.max_staleness))
        t1 = time.monotonic()
        queue = DrawQueue(self.store, step, self.cfg.groups_per_step, self.cfg.draw_cap,
                          None if self.cfg.draw_ahead < 0 else self.cfg.draw_ahead)
        done = threading.Event()
        if self.rank0:
            threading.Thread(target=self._progress, args=(step, queue, done, t1), daemon=True).start()
        try:
            outcomes = run_rank_rollouts(self.ctx, queue, step, expected_version=step - 1, stop=self.stop)
        finally:
            done.set()
        return StepRollouts(outcomes, queue, sync_s, time.monotonic() - t1, t_start, time.time())

    # ---- the loop ----------------------------------------------------------------------------
    def fit(self) -> int:
        """Run steps until cfg.steps; returns the last finished step. Raises Preempted on a signal.

        One step off-policy (max_staleness 1) the rollouts of step s+1 start, in a thread, as soon
        as step s's rollouts end, from the newest weights then published (step s-1's), and run
        while step s updates and publishes. Determinism: the in-process generator samples step s
        from exactly step s-2's weights, so a resumed run redraws the same rows; a server samples
        from whatever verified version it holds when each request runs (recorded per sample)."""
        self._install_signals()
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
        rewound = self._rewind_publications(start - 1) if self.rank0 and client else False
        rewound = self.eng.all_reduce([float(rewound)], "max")[0] > 0
        last = published(self.run_path, start - 1) if start > 1 else None
        if start > 1 and (rewound or last is None or last.transport == "broadcast"):
            # saved but never published (stopped in between), published since, or broadcast into a server
            # that may have restarted since (it starts from files): publish it again
            self._publish(start - 1)
            if rewound:                       # the server may still serve a discarded step: wait for this one
                self.exact_version = start - 1
        ahead = Ahead.started(self._rollouts, start) if self.cfg.max_staleness and start <= self.cfg.steps else None
        t_free = time.monotonic()
        try:
            for step in range(start, self.cfg.steps + 1):
                t_wait = time.monotonic()
                self.watch.phase = f"the rollouts of step {step}"
                ro = ahead.result() if ahead else self._rollouts(step)
                wait_s = time.monotonic() - t_wait
                self.watch.meet(f"rollouts-{step}", f"the rollouts of step {step}")   # bounded: no collective yet
                if self._agree_to_stop():     # also the barrier after which every rank's outcomes are in
                    if step > 1 and self.checkpointed != step - 1:   # checkpoint_every > 1: save what step-1 left
                        self._checkpoint(step - 1)
                    raise Preempted(f"stopped during the rollouts of step {step}; it is redrawn on resume")
                ahead = Ahead.started(self._rollouts, step + 1) if self.cfg.max_staleness and step < self.cfg.steps else None
                with collectives(self.watch, f"the update and publication of step {step}", self.cfg.collective_timeout):
                    self._learn(step, ro, wait_s, t_free)
                t_free = time.monotonic()
                if self.stopped or self.out_of_time:
                    return step
                if self._agree_to_stop():
                    if self.checkpointed != step:     # checkpoint_every > 1: a signal's step is saved all the same
                        self._checkpoint(step)
                    nxt = f"; the rollouts of step {step + 1} are redrawn on resume" if ahead else ""
                    raise Preempted(f"stopped after step {step} (checkpointed){nxt}")
        finally:
            if ahead is not None:     # stopping (a signal or an error): the thread sees the stop event
                self.stop.set()
                ahead.join()
        return self.cfg.steps

    def fatal(self, line: str) -> None:
        """A peer is lost (train/watch.py): end the run now: its serving job cancelled, this process ended
        with one line (srun --kill-on-bad-exit ends the other ranks). No barrier: nobody would come."""
        from tbhpc.train.watch import die
        self.watch.stop()
        try:
            stop_serving_job(self.run_path)
        except Exception:       # the one line below matters more than the cleanup
            pass
        die(line)

    def leave(self, code: int):
        """End this rank's process once its work is written (Engine.leave: no interpreter teardown). The
        watch stops first: rank 0's store goes with rank 0, and that is no longer news."""
        self.watch.stop()
        if self.tb is not None:
            self.tb.close()
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
        self._record_attempts(step, mine)
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
            stats = self.eng.update(pack(episodes, adv, budget, seq_weights=cfg.loss_agg == "seq-mean-token-mean"))
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
        row = self._step_row(step, ro.outcomes, cutoff, stats, timings, stamps)
        row.update(gen_tokens=health.length, entropy=health.entropy, overlong=health.overlong / max(health.episodes, 1),
                   filtered=int(self.eng.all_reduce([filtered])[0]), too_long=int(self.eng.all_reduce([too_long])[0]),
                   guard=action,
                   lr=cfg.lr * self.lr_scale, pool_version=self.curriculum.version_at(step),
                   pool_size=len(self.ctx.pool_for(step)))
        if self.rank0:
            if refresh:
                self.log(record_refresh(self.run_path, refresh))
            record_step(self.run, row)
            from tbhpc.store.merge import merge
            merge(self.run)
            self.log(step_line(row))
            if self.tb is not None:
                for k, v in row.items():
                    if isinstance(v, (int, float)) and not isinstance(v, bool):
                        self.tb.add_scalar(f"train/{k}", v, step)
                self.tb.flush()

    def _progress(self, step: int, queue: DrawQueue, done: threading.Event, t0: float, every_s: float = 10.0) -> None:
        """A progress line every `every_s` while a step's rollouts run (they can take minutes)."""
        while not done.wait(every_s):
            claimed, mixed = queue.progress()
            kind = "groups with a pass" if self.cfg.algorithm == "rft" else "mixed groups"
            self.log(f"step {step:>4} rollouts: {claimed} drawn, {mixed}/{self.cfg.groups_per_step} {kind}, "
                     f"{time.monotonic() - t0:.0f} s")

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
        from tbhpc.train.engine import UpdateStats
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

    def _record_attempts(self, step: int, groups) -> None:
        from tbhpc.campaign.worker import attempt_row
        from tbhpc.rollout.buffer import write_step
        from tbhpc.store.shards import write_shard
        rows, eps = [], []
        for g in groups:
            for k, r in enumerate(g.rollouts):
                version = version_of(r.episode.policy_version)
                started = datetime.now(timezone.utc)
                row = attempt_row(r.result, self.cfg.name, version, attempt_index(self.cfg, step, g.index, k), started,
                                  self.run.blobs)
                row.update(train_step=step, policy_version=version)
                rows.append(row)
                eps.extend(r.samples)
        suffix = "" if self.env.world == 1 else f".rank{self.env.rank}"
        if rows:
            write_shard(self.run.shards, rows)
        write_step(self.run_path / "buffers", step, eps, policy_version=step - 1, suffix=suffix)

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
        """This step's weights to the server (train/publish.py: a broadcast, else files every rank
        writes), with digests of exactly what was sent or written and the fingerprint; an export
        when one is due. Collective: every rank calls it."""
        from tbhpc.serve.fingerprint import compute_fingerprint
        from tbhpc.train.publish import publish_adapter, publish_broadcast, publish_files
        cfg = self.cfg
        fp = compute_fingerprint(self.eng.module, self.eng.tokenizer)
        how = publish_adapter(self.eng, self.run_path, step, fp) if cfg.adapter_sync else None
        if how is None and cfg.sync_transport == "broadcast":
            how = publish_broadcast(self.eng, self.run_path, step, fp, cfg.sync_join_timeout_s, cfg.sync_bucket_mb << 20,
                                    self.eng.gpu, self.log)
        if how is None:
            if cfg.sync_transport == "broadcast" and self.rank0:
                self.log(f"train: step {step}: no server took the broadcast within {cfg.sync_join_timeout_s:g} s "
                         "(none running, restarting, on another device, or not every member proved the run's token); "
                         "publishing files instead")
            how = publish_files(self.eng, self.run_path, step, fp)
        if self.rank0:                        # what each publication cost, phase by phase (docs/weight-sync.md)
            (self.run_path / "logs").mkdir(exist_ok=True)
            with open(self.run_path / "logs" / "publish.jsonl", "a", encoding="utf-8") as f:
                f.write(json.dumps({"step": step, "at": time.time(), **how}) + "\n")
        due = (cfg.export_every and step % cfg.export_every == 0) or step == cfg.steps or self.stopped or self.out_of_time
        if due:
            from tbhpc.train.publish import export_step
            dest = export_step(self.eng, self.run_path, step, how)
            if self.rank0 and cfg.export_eval:
                self.log(start_export_eval(cfg, self.run_path, step, dest))
        if self.rank0:
            self._prune_published(step)
        self.eng.barrier()

    def _rewind_publications(self, resumed: int) -> bool:
        """A run resumed from the DeepSpeed checkpoint of step `resumed` discards what it published
        after it (the server may serve one of those: its next sync goes back to `resumed`, by time of
        publication). True when there was anything to discard. Rank 0 only."""
        from tbhpc.serve.broadcast import OFFER
        ckpts, found = self.run_path / "checkpoints", False
        for marker in sorted(ckpts.glob("step-*.ready")) + sorted(ckpts.glob(f"step-*{OFFER}")):
            step = int(marker.name[5:11])
            if step > resumed:
                marker.unlink(missing_ok=True)
                shutil.rmtree(ckpts / version_name(step), ignore_errors=True)
                found = True
        return found

    def _prune_published(self, step: int) -> None:
        """Published weights older than the newest `keep_published` go (marker first, so nobody
        picks up a directory that is being removed); exports/ keeps its own copies."""
        for old in range(1, step - self.cfg.keep_published + 1):
            marker = self.run_path / "checkpoints" / f"{version_name(old)}.ready"
            if marker.exists():
                marker.unlink()
                shutil.rmtree(self.run_path / "checkpoints" / version_name(old), ignore_errors=True)

    def _step_row(self, step, outcomes, cutoff, stats, timings, stamps) -> dict:
        import torch.distributed as dist
        mine = [g for g in outcomes if g.index <= cutoff]
        local = {
            "drawn": len(mine), "kept": sum(g.status == MIXED for g in mine), "flat": sum(g.status == FLAT for g in mine),
            "dropped": sum(g.status == DROPPED for g in mine), "surplus": sum(g.index > cutoff for g in outcomes),
            "reruns": sum(g.reruns for g in outcomes),
            "reward_sum": sum(r.episode.reward for g in mine for r in g.rollouts),
            "kept_reward_sum": sum(r.episode.reward for g in mine if g.status == MIXED for r in g.rollouts),
            "episodes": sum(len(g.rollouts) for g in mine), "kept_episodes": sum(len(g.rollouts) for g in mine if g.status == MIXED),
            "tokens": stats.tokens, "loss_tokens": stats.loss_tokens, "micro_batches": stats.micro_batches,
            "loss": stats.loss, "clip_tokens": stats.clip_fraction * stats.loss_tokens,
            "truncated_tokens": stats.truncated * stats.loss_tokens,
            "mismatch_tokens": stats.mismatch * stats.loss_tokens, "ratio_max": stats.ratio_max,
            "entropy_tokens": stats.entropy * stats.loss_tokens, "peak_bytes": stats.peak_bytes,
            "staleness": max((step - 1 - r.episode.policy_version for g in mine for r in g.rollouts), default=0),
        }
        parts = [local]
        if self.env.world > 1:
            parts = [None] * self.env.world
            dist.all_gather_object(parts, local)
        tot = {k: sum(p[k] for p in parts) for k in local if k not in ("ratio_max", "staleness", "peak_bytes")}
        lt = tot["loss_tokens"] or 1
        return {
            "run": self.cfg.name, "step": step, "policy_version": version_of(step - 1), "world": self.env.world,
            **{k: int(tot[k]) for k in ("drawn", "kept", "flat", "dropped", "surplus", "reruns", "episodes", "tokens",
                                        "loss_tokens", "micro_batches")},
            "mixed_share": tot["kept"] / max(tot["kept"] + tot["flat"], 1),
            "reward_mean": tot["reward_sum"] / max(tot["episodes"], 1),
            "kept_reward_mean": tot["kept_reward_sum"] / max(tot["kept_episodes"], 1),
            "loss": tot["loss"], "grad_norm": stats.grad_norm, "clip_fraction": tot["clip_tokens"] / lt,
            "mismatch": tot["mismatch_tokens"] / lt, "ratio_max": max(p["ratio_max"] for p in parts),
            "policy_entropy": tot["entropy_tokens"] / lt, "peak_gb": max(p["peak_bytes"] for p in parts) / 1e9,
            "staleness": max(p["staleness"] for p in parts), "normalize_std": self.cfg.normalize_std,
            **{k: round(v, 4) for k, v in timings.items()},
            "finished_at": _utc(time.time()),
            "max_staleness": self.cfg.max_staleness, "truncated": tot["truncated_tokens"] / lt,
            **{k: _utc(v) for k, v in stamps.items()},   # rank 0's clock (the timeline of `tbhpc report`)
        }

    # ---- signals -----------------------------------------------------------------------------
    def _install_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGUSR2, signal.SIGTERM):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum, _frame) -> None:
        first = not self.stop.is_set()
        self.stop.set()
        if first:   # os.write, not print: the handler may interrupt the main thread's print on this stream
            try:
                os.write(2, f"train: rank {self.env.rank} got {signal.Signals(signum).name} at "
                            f"{datetime.now().strftime('%H:%M:%S.%f')[:-3]}; stopping at the next safe point\n".encode())
            except OSError:
                pass    # stderr gone (a closed pipe): stopping matters, the line does not

    def _agree_to_stop(self) -> bool:
        return bool(self.eng.all_reduce([1.0 if self.stop.is_set() else 0.0], "max")[0])


def _user_judge(cfg: TrainConfig):
    from tbhpc.agents import build_judge, build_user
    return build_user(cfg), build_judge(cfg)


def _tensorboard(run_path: Path):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise UserError(f"train config: tensorboard=true needs the tensorboard package ({exc})") from None
    return SummaryWriter(str(run_path / "tensorboard"))

