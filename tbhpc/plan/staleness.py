"""How far off-policy a training config should run: the scaling model's step time for each
`max_staleness` k on the config's own layout, with the rates of a hardware file (jobs/plan/*.yaml:
every figure named with its source or marked an assumption), and the k it recommends.

Why in `tbhpc plan`: the step a config asks for (its groups, its nodes, its serving replicas) is
known before anything runs, and the question "does k = 2 pay here?" is answered by the same model
the measurements calibrate (bench/scaling.py, bench/async_k.py). The answer is a prediction:
its lines say which rates and which assumed episode tail it comes from.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import yaml

from tbhpc.errors import UserError
from tbhpc.plan.model import Cluster, Workload, recommended_staleness, step_time


@dataclasses.dataclass
class StalenessPlan:
    rates: str                      # the hardware file's name
    source: str                     # its path
    steps: list[float]              # predicted step seconds for k = 0, 1, ...
    recommended: int
    configured: int
    tail_s: float                   # the longest episode's seconds the model assumes
    trainer_gpus: int
    replicas: int


def staleness_plan(cfg, rates_path: Path, serve=None, most: int = 4) -> StalenessPlan:
    """Step time by k for `cfg` (a TrainConfig; `serve` its serving job's ServeConfig, for the
    replicas) on the rates of `rates_path`; the workload's per-episode figures come from the file,
    the step's shape (groups, group size, draws, episodes in flight) from the config."""
    try:
        hw = yaml.safe_load(Path(rates_path).read_text(encoding="utf-8")) or {}
        cluster, workload = dict(hw["cluster"]), dict(hw["workload"])
    except (OSError, KeyError, TypeError, yaml.YAMLError) as exc:
        raise UserError(f"{rates_path}: not a scaling-model rates file ({type(exc).__name__}: {exc})") from None
    w = Workload(**{**workload, "groups": cfg.groups_per_step, "group_size": cfg.group_size, "max_draws": cfg.max_draws})
    per_replica = int(hw.get("replica_gpus", 1))
    replicas = max(1, (serve.tensor_parallel_size * serve.data_parallel_size // per_replica) if serve else 1)
    c = Cluster(**{**cluster, "trainer_nodes": cfg.nodes, "ranks_per_node": max(1, cfg.gpus_per_node),
                   "replicas": replicas, "in_flight": cfg.episodes_in_flight})
    steps = [step_time(w, c, k).step_s for k in range(most + 1)]
    tail = w.tail_tokens / c.stream_tokens_per_s + w.turns * w.env_s_per_turn
    return StalenessPlan(str(hw.get("name", Path(rates_path).stem)), str(rates_path), steps,
                         recommended_staleness(w, c, most), cfg.max_staleness, tail, c.ranks, replicas)


def render(p: StalenessPlan) -> list[str]:
    """The plan's lines (pure: golden-tested)."""
    lines = [f"step time by max_staleness (predicted: {p.rates}, {p.source}; {p.trainer_gpus} trainer GPU(s), "
             f"{p.replicas} serving replica(s); longest episode assumed {p.tail_s:.0f} s):"]
    for k, s in enumerate(p.steps):
        mark = "  <- recommended" if k == p.recommended else ""
        mark += "  (this config)" if k == p.configured else ""
        speed = f"{p.steps[1] / s:.2f}x k=1" if k else ""
        lines.append(f"    k={k}  {s:8.0f} s/step  {speed:>10}{mark}")
    lines.append(f"  recommended max_staleness: {p.recommended} (the smallest k past which one more saves < 5% of a step; "
                 "each k costs learning: tokens k updates old, more of them truncated)")
    return lines
