"""What a training run leaves behind, in the same run directory layout as a campaign:

    RUN/campaign.json, config.yaml, plan.jsonl, tasks.json   kind "train"; the plan is the pool (repeats = G)
    RUN/shards/ -> results.duckdb `attempts`                  one row per rollout episode: campaign = the
                                                             run's name, policy_id = the weights that sampled
                                                             it, train_step, policy_version; attempt_index
                                                             ((step-1) x draw cap + draw) x G + k: unique in
                                                             the run (attempt_index)
    RUN/results.duckdb `train_steps`                          one row per step (logs/train_steps.jsonl too)
    RUN/buffers/step-N[.rankR].h5                             the episodes token-exact (rollout/buffer.py)
    RUN/checkpoints/step-N (+ .ready)                         published weights (serve/checkpoints.py)
    RUN/ds_checkpoints/                                       DeepSpeed state for resume
    RUN/exports/step-N                                        HF exports kept for evaluation

Why the campaign layout: rollouts are attempts like any other, so the SQL that reads probes and
evals reads training too (`SELECT train_step, avg(reward) FROM attempts GROUP BY 1`).
"""
from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone
from pathlib import Path

import yaml

from tbhpc.campaign.config import pack_hash, plan_rows
from tbhpc.config import resolved
from tbhpc.errors import UserError
from tbhpc.serve.checkpoints import BASE_VERSION, version_name
from tbhpc.store.merge import connect, insert_rows
from tbhpc.store.run_dir import RunDir
from tbhpc.train.config import TrainConfig

# fields that say how a run executes, not what it learns: they may change when a run resumes
EXECUTION_FIELDS = ("steps", "max_seconds", "episodes_in_flight", "microbatch_tokens", "torch_threads", "checkpoint_every",
                    "keep_checkpoints", "keep_published", "export_every", "export_eval", "export_eval_overrides",
                    "sync_timeout_s", "tensorboard", "trackers", "tracker_project", "tracker_tags",
                    "tracker_samples_every", "tracker_samples", "tracker_timeout_s", "nodes", "gpus_per_node", "serve_config", "serve", "slurm",
                    "logprob_chunk", "sp_size", "tiled_mlp", "checkpoint_offload", "offload_optimizer", "offload_params",
                    "gpu_memory_gb", "host_memory_gb", "env", "collective_timeout_s", "request_floor_tokens_per_s",
                    "sync_transport", "sync_join_timeout_s", "sync_bucket_mb", "openenv", "lora_sync", "export_merged")

STEP_COLUMNS: dict[str, str] = {
    "run": "VARCHAR", "step": "INTEGER", "policy_version": "VARCHAR", "world": "INTEGER",
    "drawn": "INTEGER", "kept": "INTEGER", "flat": "INTEGER", "dropped": "INTEGER", "surplus": "INTEGER",
    "reruns": "INTEGER", "mixed_share": "DOUBLE", "reward_mean": "DOUBLE", "kept_reward_mean": "DOUBLE",
    "episodes": "INTEGER", "tokens": "BIGINT", "loss_tokens": "BIGINT", "micro_batches": "INTEGER",
    "loss": "DOUBLE", "grad_norm": "DOUBLE", "clip_fraction": "DOUBLE", "mismatch": "DOUBLE", "ratio_max": "DOUBLE",
    "staleness": "INTEGER", "normalize_std": "BOOLEAN",
    "rollout_s": "DOUBLE", "update_s": "DOUBLE", "publish_s": "DOUBLE", "sync_s": "DOUBLE", "step_s": "DOUBLE",
    "finished_at": "TIMESTAMP",
    # one step off-policy: the bound, the share of IS weights tis_cap truncated, the trainer's wait for
    # rollouts, and the step's timeline (rollouts of step s+1 overlap the update of step s)
    "max_staleness": "INTEGER", "truncated": "DOUBLE", "wait_s": "DOUBLE",
    "rollout_start": "TIMESTAMP", "rollout_end": "TIMESTAMP", "update_start": "TIMESTAMP", "update_end": "TIMESTAMP",
    "published": "TIMESTAMP",
    # stability (train/stability.py): mean generated tokens per episode, entropy (mean surprisal of the sampled
    # tokens), share of episodes cut off by the budget, episodes the overlong filter kept out of the loss,
    # the collapse guard's action ('' | rollback | stop) and the learning rate the step used
    "gen_tokens": "DOUBLE", "entropy": "DOUBLE", "overlong": "DOUBLE", "filtered": "INTEGER", "guard": "VARCHAR",
    "lr": "DOUBLE",
    # the trained policy's mean entropy over the loss tokens (nats; computed with the logprobs), and the
    # update's peak memory on its busiest rank (GPU: allocated by torch; CPU: resident), beside `tbhpc plan`
    "policy_entropy": "DOUBLE", "peak_gb": "DOUBLE",
    "too_long": "INTEGER",      # samples longer than the plan's longest trainable episode, left out of the update
    "pool_version": "INTEGER", "pool_size": "INTEGER",   # the curriculum's pool this step drew from (0: the selected one)
    # off-policy by k (train/window.py): the step's loss tokens by staleness 0..k (index i: i updates old),
    # and the clip, truncation and mismatch figures of each of those groups of tokens; episodes whose tokens
    # came from more than one version, turns issued again after a sync, tokens the server prefilled again
    "staleness_tokens": "BIGINT[]", "clip_by_staleness": "DOUBLE[]", "truncated_by_staleness": "DOUBLE[]",
    "mismatch_by_staleness": "DOUBLE[]", "spanning": "INTEGER", "reissued": "INTEGER", "reprefilled": "BIGINT",
}


def identity(cfg: TrainConfig) -> dict:
    d = resolved(cfg)
    d["tis_cap"] = cfg.truncation_cap       # what the loss uses: unset and its default are the same run
    for k in EXECUTION_FIELDS:
        d.pop(k, None)
    if d.get("environment") == "local":     # the default: runs made before the field existed keep their hash
        d.pop("environment")
    if not d.get("lora_rank"):              # likewise: full-parameter runs say nothing of LoRA
        for k in ("lora_rank", "lora_alpha", "lora_dropout", "lora_targets"):
            d.pop(k, None)
    return d


def open_train_run(cfg: TrainConfig, path: Path, tasks: list) -> RunDir:
    """Create the run directory, or check that an existing one is the same training run."""
    run = RunDir(Path(path))
    ident = json.dumps({**identity(cfg), "pack_hash": pack_hash(_pack(cfg))}, sort_keys=True, default=str)
    chash = hashlib.sha256(ident.encode()).hexdigest()[:16]
    if run.exists():
        if run.config_hash() != chash:
            old = yaml.safe_load(run.config_file.read_text(encoding="utf-8")) or {}
            diffs = [k for k, v in identity(cfg).items() if old.get(k, v) != v]
            what = f"field {diffs[0]!r} differs" if diffs else "the task pack changed"
            raise UserError(f"{run.path}: holds a different training run ({what}); use a new run directory")
        return run
    camp = {"campaign": cfg.name, "kind": "train", "policy_id": Path(cfg.model).name or cfg.model, "config_hash": chash,
            "config": resolved(cfg), "created_at": datetime.now(timezone.utc).isoformat(sep=" ")[:26], "source": "tbhpc"}
    run.create(resolved(cfg), chash, camp, plan_rows(tasks, cfg.group_size), [t.to_dict() for t in tasks])
    return run


def _pack(cfg: TrainConfig) -> Path:
    from tbhpc.tasks.loader import resolve_pack
    return resolve_pack(cfg.pack)


def version_of(step: int) -> str:
    """The version name of step `step`'s weights (step 0: the base model), as rows and servers say it."""
    return BASE_VERSION if step == 0 else version_name(step)


def attempt_index(cfg: TrainConfig, step: int, draw: int, k: int) -> int:
    """A rollout's attempt index, unique in the run: off-policy two steps can be sampled by the same
    weights (the attempt key's policy_id), so the index counts across steps, not within one."""
    return ((step - 1) * cfg.draw_cap + draw) * cfg.group_size + k


def record_attempts(run: RunDir, cfg: TrainConfig, step: int, groups, rank: int, world: int) -> None:
    """This rank's rollouts of the step: one attempt row each (a shard, merged into results.duckdb
    after the step) and the episodes token-exact (buffers/step-N[.rankR].h5)."""
    # here, not at the top: the readers of this module (report, demo) need neither h5py nor the episode runner
    from tbhpc.campaign.worker import attempt_row
    from tbhpc.rollout.buffer import write_step
    from tbhpc.store.shards import write_shard
    rows, eps = [], []
    for g in groups:
        for k, r in enumerate(g.rollouts):
            version = version_of(r.episode.policy_version)
            started = datetime.now(timezone.utc)
            row = attempt_row(r.result, cfg.name, version, attempt_index(cfg, step, g.index, k), started, run.blobs)
            samples = r.samples
            row.update(train_step=step, policy_version=version,
                       newest_version=version_of(max(x.newest_version for x in samples)),
                       version_switches=sum(x.switches for x in samples), reissued_turns=sum(x.reissued for x in samples),
                       reprefilled_tokens=sum(x.reprefilled for x in samples))
            rows.append(row)
            eps.extend(r.samples)
    suffix = "" if world == 1 else f".rank{rank}"
    if rows:
        write_shard(run.shards, rows)
    write_step(run.path / "buffers", step, eps, policy_version=step - 1, suffix=suffix)


def record_step(run: RunDir, row: dict, log: bool = True) -> None:
    """Append the step to logs/train_steps.jsonl and replace it in `train_steps` (under the run's lock)."""
    if log:
        run.logs.mkdir(parents=True, exist_ok=True)
        with open(run.logs / "train_steps.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(row, default=str) + "\n")
    with run.lock():
        con = connect(run)
        try:
            con.execute(f"CREATE TABLE IF NOT EXISTS train_steps ({', '.join(f'{c} {t}' for c, t in STEP_COLUMNS.items())}, "
                        "PRIMARY KEY (run, step))")
            for c, t in STEP_COLUMNS.items():        # a results file from before a column existed
                con.execute(f"ALTER TABLE train_steps ADD COLUMN IF NOT EXISTS {c} {t}")
            insert_rows(con, "train_steps", [row], STEP_COLUMNS, replace=True)
        finally:
            con.close()


def restore_steps(run: RunDir) -> int:
    """`train_steps` again from logs/train_steps.jsonl (after a rebuilt results file); the last
    line of a step wins, as it did when it was recorded. Returns the steps restored."""
    rows = {row.get("step"): row for row in read_steps(run)}
    for row in rows.values():
        record_step(run, row, log=False)
    return len(rows)


def read_steps(run: RunDir) -> list[dict]:
    path = run.logs / "train_steps.jsonl"
    if not path.exists():
        return []
    last: dict[int, dict] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            last[int(row["step"])] = row      # a re-run step (after a requeue) replaces the earlier line
    return [last[k] for k in sorted(last)]


def _ages(row: dict) -> str:
    """Loss tokens by staleness as shares, with the truncation of the stale ones: '0:41% 1:37% 2:22% trunc 0.031'."""
    n = sum(row["staleness_tokens"]) or 1
    shares = " ".join(f"{i}:{100 * t / n:.0f}%" for i, t in enumerate(row["staleness_tokens"]))
    return shares + f" trunc {row.get('truncated', 0.0):.3f}" + (f" reissued {row['reissued']}" if row.get("reissued") else "")


def step_line(row: dict) -> str:
    """The console line of one step (pure)."""
    return (f"step {row['step']:>4} [{row['policy_version']}] reward {row['reward_mean']:.3f} "
            f"mixed {row['kept']}/{row['kept'] + row['flat']} (drawn {row['drawn']}, dropped {row['dropped']}, "
            f"re-runs {row['reruns']}) tokens {row['tokens']} loss {row['loss']:+.4f} |g| {row['grad_norm']:.3g} "
            f"clip {row['clip_fraction']:.3f} Δlp {row['mismatch']:.2e} | rollout {row['rollout_s']:.1f}s "
            f"update {row['update_s']:.1f}s publish {row['publish_s']:.1f}s sync {row['sync_s']:.1f}s"
            + (f" wait {row['wait_s']:.1f}s (staleness {row['staleness']})" if row.get("max_staleness") else "")
            + (f" | age {_ages(row)}" if (row.get("max_staleness") or 0) >= 2 and row.get("staleness_tokens") else "")
            + (f" | len {row['gen_tokens']:.0f} H {row['entropy']:.3f}" if row.get("gen_tokens") is not None else "")
            + (f" GUARD {row['guard']}" if row.get("guard") else ""))
