"""One row per training step: summed over the ranks (`step_row`), then recorded, merged into
results.duckdb, printed and plotted (`StepLog`, rank 0).

Why apart from the loop: the loop decides what a step does; what is written about it (the
train_steps row, the attempts merged in after it, the console line, the trackers' scalars)
is the run record's business (record.py holds the tables).
"""
from __future__ import annotations

import time
from datetime import datetime, timezone

from tbhpc.store.merge import merge
from tbhpc.store.run_dir import RunDir
from tbhpc.track.fanout import Trackers
from tbhpc.track.samples import COLUMNS, step_samples
from tbhpc.train.config import TrainConfig
from tbhpc.train.queue import DROPPED, FLAT, MIXED
from tbhpc.train.record import record_step, step_line, version_of


def _utc(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).replace(tzinfo=None).isoformat(sep=" ")


def step_row(cfg: TrainConfig, world: int, step: int, outcomes, cutoff: int, stats, timings: dict,
             stamps: dict) -> dict:
    """The step's train_steps row from every rank's outcomes and update stats (collective: every
    rank calls it; the times and stamps are this rank's)."""
    import torch.distributed as dist     # here: `tbhpc train` sets the OpenMP policy before torch loads (engine.py)
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
        "spanning": sum(s.switches > 0 for g in mine for r in g.rollouts for s in r.samples),
        "reissued": sum(s.reissued for g in mine for r in g.rollouts for s in r.samples),
        "reprefilled": sum(s.reprefilled for g in mine for r in g.rollouts for s in r.samples),
        "by_staleness": stats.by_staleness or [[0.0] * 4 for _ in range(cfg.max_staleness + 1)],
    }
    parts = [local]
    if world > 1:
        parts = [None] * world
        dist.all_gather_object(parts, local)
    tot = {k: sum(p[k] for p in parts) for k in local if k not in ("ratio_max", "staleness", "peak_bytes", "by_staleness")}
    split = [[sum(p["by_staleness"][b][i] for p in parts) for i in range(4)] for b in range(cfg.max_staleness + 1)]
    lt = tot["loss_tokens"] or 1
    return {
        "run": cfg.name, "step": step, "policy_version": version_of(step - 1), "world": world,
        **{k: int(tot[k]) for k in ("drawn", "kept", "flat", "dropped", "surplus", "reruns", "episodes", "tokens",
                                    "loss_tokens", "micro_batches")},
        "mixed_share": tot["kept"] / max(tot["kept"] + tot["flat"], 1),
        "reward_mean": tot["reward_sum"] / max(tot["episodes"], 1),
        "kept_reward_mean": tot["kept_reward_sum"] / max(tot["kept_episodes"], 1),
        "loss": tot["loss"], "grad_norm": stats.grad_norm, "clip_fraction": tot["clip_tokens"] / lt,
        "mismatch": tot["mismatch_tokens"] / lt, "ratio_max": max(p["ratio_max"] for p in parts),
        "policy_entropy": tot["entropy_tokens"] / lt, "peak_gb": max(p["peak_bytes"] for p in parts) / 1e9,
        "staleness": max(p["staleness"] for p in parts), "normalize_std": cfg.normalize_std,
        **{k: round(v, 4) for k, v in timings.items()},
        "finished_at": _utc(time.time()),
        "max_staleness": cfg.max_staleness, "truncated": tot["truncated_tokens"] / lt,
        **{k: _utc(v) for k, v in stamps.items()},   # rank 0's clock (the timeline of `tbhpc report`)
        **staleness_columns(split),
        **{k: int(tot[k]) for k in ("spanning", "reissued", "reprefilled")},
    }


def staleness_columns(split: list[list[float]]) -> dict:
    """The per-staleness columns of a train_steps row from the summed [loss tokens, clipped,
    truncated, sum |log pi/mu|] of each staleness 0..k."""
    def share(i: int) -> list[float]:
        return [round(b[i] / b[0], 6) if b[0] else 0.0 for b in split]
    return {"staleness_tokens": [int(b[0]) for b in split], "clip_by_staleness": share(1),
            "truncated_by_staleness": share(2), "mismatch_by_staleness": share(3)}


class StepLog:
    """Rank 0's account of each step: the train_steps row (logs/train_steps.jsonl and results.duckdb),
    the step's attempt shards merged into results.duckdb, the console line, and the row's numbers to
    the run's trackers (with, every `samples_every` steps, a table of a few of the step's episodes)."""

    def __init__(self, run: RunDir, trackers: Trackers | None = None, log=print, samples_every: int = 0,
                 samples: int = 0, timeout_s: float = 60.0):
        self.run, self.trackers, self.log = run, trackers, log
        self.samples_every, self.samples, self.timeout_s = samples_every, samples, timeout_s

    def write(self, row: dict) -> None:
        record_step(self.run, row)
        merge(self.run)
        self.log(step_line(row))
        if self.trackers is None:
            return
        step = row["step"]
        self.trackers.scalars(step, row_scalars(row))
        if self.samples_every and self.samples and step % self.samples_every == 0:
            self.trackers.table(step, "samples", COLUMNS, step_samples(self.run.path, step, self.samples))

    def close(self) -> None:
        if self.trackers is not None:
            self.trackers.close(self.timeout_s)


def row_scalars(row: dict) -> dict[str, float]:
    """What a tracker gets of a train_steps row: its numbers, each under train/<column> (nothing the
    table lacks; text, times and lists stay in results.duckdb)."""
    return {f"train/{k}": v for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
