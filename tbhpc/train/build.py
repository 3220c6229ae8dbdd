"""A trainer rank's parts, made from its TrainConfig: the tasks and the curriculum over the pool,
the DeepSpeed engine, the run directory, the draw queue's store and the peer watch, the
environments, the rollout policy and the source of the weights it samples from, the collapse
guard and the step log. `build_trainer` hands them to a `Trainer` (loop.py); every rank runs it.

Why apart from the loop: the loop runs steps with whatever parts it is given (the tests hand it
stand-ins); which parts a run has, and the order they must come up in (checks before the model
loads, the run directory on rank 0 before the other ranks open it, the watch before anything
slow), is decided here once.
"""
from __future__ import annotations

import dataclasses
import json
import threading
from pathlib import Path

from tbhpc.agents import build_judge, build_user, check_judge
from tbhpc.env.registry import Environments, preflight
from tbhpc.openenv.launch import openenv_spec
from tbhpc.store.run_dir import RunDir
from tbhpc.tasks.select import select_tasks
from tbhpc.track.run_trackers import start_trackers
from tbhpc.train.config import TrainConfig
from tbhpc.train.curriculum import Curriculum
from tbhpc.train.draw import load_pool
from tbhpc.train.engine import DistEnv, Engine
from tbhpc.train.jobs import end_run
from tbhpc.train.loop import Trainer, trainable_tokens
from tbhpc.train.queue import make_store
from tbhpc.train.record import open_train_run
from tbhpc.train.pending import PendingGroups
from tbhpc.train.rollouts import RolloutContext
from tbhpc.train.stability import CollapseGuard
from tbhpc.train.steplog import StepLog
from tbhpc.train.watch import Watch
from tbhpc.train.weights import LocalWeights, ServerWeights, rollout_policy


def build_trainer(cfg: TrainConfig, run_path: Path, env: DistEnv | None = None, log=print) -> Trainer:
    """The trainer of run directory `run_path` (created on rank 0, or checked to hold this run) for
    this rank (`env`: from the environment, Slurm's or torchrun's, by default)."""
    cfg.validate()
    env = env or DistEnv.from_environ()
    rank0 = env.rank == 0
    stop = threading.Event()
    pool = load_pool(cfg.pool, cfg.exclude)
    candidates = load_pool(cfg.refresh_pool, cfg.exclude) if cfg.refresh_pool else []
    tasks = {t.id: t for f in [cfg.pool] + ([cfg.refresh_pool] if candidates else [])
             for t in select_tasks(cfg.pack, f)}
    tasks = list(tasks.values())
    curriculum = Curriculum(pool, candidates, cfg.seed, cfg.refresh_below, cfg.refresh_window, 2 * cfg.group_size,
                            cfg.refresh_size, cfg.max_staleness)
    check_judge(tasks, cfg.judge, skip_field=False)
    if rank0:
        preflight(tasks, cfg.servers, openenv_spec(cfg.environment, cfg.openenv, 'train config'))
    run_path = Path(run_path).resolve()
    eng = Engine(cfg, env)
    attn = getattr(eng.module.config, "_attn_implementation", "") or ""
    max_train_tokens = trainable_tokens(cfg, flash="flash" in attn if eng.gpu else None)
    if rank0:
        open_train_run(cfg, run_path, tasks)     # creates it, or checks a resumed one is the same run
    eng.barrier()
    run = RunDir(run_path).require()
    store = make_store(env.rank, env.world, env.master_addr, env.master_port + 1)
    watch = Watch(store, env.rank, env.world, cfg.silence_timeout, cfg.collective_timeout, "collective_timeout_s",
                  on_fatal=lambda line: end_run(watch, run_path, line)).start()
    envs = Environments(cfg.servers, openenv=openenv_spec(cfg.environment, cfg.openenv, 'train config'))
    policy = rollout_policy(cfg, run_path)
    ctx = RolloutContext(pool, {t.id: t for t in tasks}, envs.for_task, policy, build_user(cfg), build_judge(cfg),
                         group_size=cfg.group_size, seed=cfg.seed, max_reruns=cfg.max_reruns,
                         max_staleness=cfg.max_staleness, episodes_in_flight=cfg.in_flight_per_rank(env.world) if cfg.generator != "local" else 1,
                         overlong=(cfg.response_budget, cfg.overlong_buffer, cfg.overlong_penalty),
                         min_group_std=cfg.min_group_std, algorithm=cfg.algorithm,
                         pool_at=curriculum.pool_at, pending=PendingGroups(run_path))
    if cfg.generator == "server":
        weights = ServerWeights(run_path, cfg.sync_timeout_s, or_newer=cfg.max_staleness > 0, stop=stop)
    else:
        weights = LocalWeights(policy, eng.tokenizer, run_path, cfg.model, batched=cfg.generator == "batched")
    guard = CollapseGuard(cfg.guard_length, cfg.guard_entropy, cfg.guard_window, cfg.guard_reference or None)
    trackers = None
    if rank0:
        trackers = start_trackers(cfg.tracker_names(), run_path, cfg.tracker_project, cfg.tracker_tags,
                                  json.loads(json.dumps(dataclasses.asdict(cfg), default=str)), log)
    steplog = StepLog(run, trackers, log, cfg.tracker_samples_every, cfg.tracker_samples, cfg.tracker_timeout_s)
    return Trainer(cfg, env=env, eng=eng, run=run, store=store, watch=watch, envs=envs, ctx=ctx, weights=weights,
                   curriculum=curriculum, guard=guard, steplog=steplog, stop=stop, max_train_tokens=max_train_tokens,
                   log=log)
