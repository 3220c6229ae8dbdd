"""The scaling model's inputs, measured: read a training run's own files (results.duckdb
`train_steps` and `attempts`, config.yaml, the exported weights) and return the Workload it
ran and the rates its cluster achieved. A user re-measures on their cluster by running a few steps
(`tbhpc submit train ... steps=6`) and pointing `bench/scaling.py --calibrate` at the run.

Why medians over steps 2..N: step 1 pays one-off costs (the server's first requests, DeepSpeed's
first allocation), which a long run does not repeat.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from tbhpc.errors import UserError
from tbhpc.plan.model import Cluster, Workload


@dataclass
class Measured:
    """What one run measured, per step (medians over its steady steps)."""
    run: str
    world: int
    max_staleness: int
    rollout_s: float
    update_s: float
    publish_s: float
    sync_s: float
    step_s: float
    trainer_wait_s: float
    workload: Workload
    decode_tokens_per_s: float        # generated tokens of a step / its rollout seconds
    stream_tokens_per_s: float        # one episode's generated tokens / its wall seconds (median)
    update_points: list[tuple[float, float]]    # (trained tokens per rank, update seconds) per step
    weights_gb: float
    in_flight: int = 0                # episodes the trainer kept in flight (episodes_in_flight: the run's total)


def _median(xs) -> float:
    xs = [x for x in xs if x is not None]
    return float(statistics.median(xs)) if xs else float("nan")


def measure_run(path: Path) -> Measured:
    import duckdb

    from tbhpc.store.run_dir import RunDir
    run = RunDir(Path(path)).require()
    con = duckdb.connect(str(run.db), read_only=True)
    try:
        cur = con.execute("SELECT step, world, coalesce(max_staleness, 0) AS max_staleness, rollout_s, update_s, "
                          "publish_s, sync_s, step_s, coalesce(wait_s, rollout_s + sync_s) AS wait_s, tokens, drawn, "
                          "kept, flat FROM train_steps ORDER BY step")
        names = [d[0] for d in cur.description]
        steps = [dict(zip(names, row)) for row in cur.fetchall()]
        eps = con.execute("SELECT train_step, agent_out + coalesce(agent_reasoning, 0), agent_turns, wall_s FROM attempts "
                          "WHERE train_step IS NOT NULL AND status = 'ok'").fetchall()
    finally:
        con.close()
    if len(steps) < 2:
        raise UserError(f"{path}: {len(steps)} training step(s) recorded; the scaling model needs 2 or more")
    steady, cfg, world = steps[1:], _config(run), int(steps[0]["world"])
    group_size = int(cfg.get("group_size", 8))

    def med(key: str) -> float:
        return _median([st[key] for st in steady])

    gen_by_step: dict[int, list[float]] = {}
    for step, out, _, _ in eps:
        gen_by_step.setdefault(int(step), []).append(float(out or 0))
    kept = sum(st["kept"] for st in steady)
    workload = Workload(
        groups=round(med("kept")), group_size=group_size,
        mixed_share=kept / max(1, sum(st["kept"] + st["flat"] for st in steady)),
        gen_tokens=statistics.fmean(float(e[1] or 0) for e in eps) if eps else 0.0,
        tail_tokens=_median([max(v) for k, v in gen_by_step.items() if k > 1]),
        context_tokens=sum(st["tokens"] for st in steady) / max(1, kept * group_size),    # trained: kept groups only
        turns=statistics.fmean(float(e[2] or 0) for e in eps) if eps else 0.0)
    exports = [d for d in (run.path / "exports").glob("*/") if d.is_dir()]
    weights = sum(f.stat().st_size for d in exports for f in d.glob("*.safetensors")) / 1e9 / max(1, len(exports))
    return Measured(
        str(path), world, int(steps[0]["max_staleness"]), med("rollout_s"), med("update_s"), med("publish_s"),
        med("sync_s"), med("step_s"), med("wait_s"), workload,
        decode_tokens_per_s=_median([sum(gen_by_step.get(st["step"], [])) / st["rollout_s"] for st in steady
                                     if st["rollout_s"]]),
        stream_tokens_per_s=_median([float(e[1] or 0) / e[3] for e in eps if e[3]]),
        update_points=[(st["tokens"] / world, st["update_s"]) for st in steady], weights_gb=weights,
        in_flight=world * math.ceil(int(cfg.get("episodes_in_flight", 0) or 0) / world))    # the run's total, by ranks


def _config(run) -> dict:
    import yaml
    return yaml.safe_load(run.config_file.read_text(encoding="utf-8")) or {}


def fit_line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares (slope, intercept) of y on x; intercept clipped at 0 (a fixed cost is never negative)."""
    n = len(points)
    mx, my = sum(p[0] for p in points) / n, sum(p[1] for p in points) / n
    var = sum((p[0] - mx) ** 2 for p in points)
    slope = sum((p[0] - mx) * (p[1] - my) for p in points) / var if var else my / mx
    icpt = my - slope * mx
    if icpt < 0 or slope <= 0:
        return my / mx, 0.0
    return slope, icpt


def calibrate(runs: list[Measured], parallel_ranks: int = 0, shared_compute: bool = False,
              publish_gb_per_s: float = 1.0, sync_gb_per_s: float = 1.0) -> Cluster:
    """The rates measured runs achieved, as a Cluster (shaped like the first run). Two on-policy
    runs of different ranks are enough: the one with the fewest ranks gives the update's tokens/s
    per rank (a line through its steps: slope and fixed cost), the one with the most the extra
    cost per added rank; their rollouts at two concurrencies give the server's saturation curve
    (1/throughput is linear in 1/episodes in flight). Per-GB rates are named inputs: a tiny
    model's publish and sync are all fixed cost, so they cannot be fitted here."""
    small, big = min(runs, key=lambda m: m.world), max(runs, key=lambda m: m.world)
    slope, fixed = fit_line(small.update_points)
    tokens_per_s = 1.0 / slope
    comm = 0.0
    if big.world > small.world:
        par = min(big.world, parallel_ranks) if parallel_ranks else big.world
        compute = _median([tok * big.world / par * slope for tok, _ in big.update_points]) + fixed
        comm = max(0.0, (big.update_s - compute) / (big.world - 1))
    decode, half = small.decode_tokens_per_s, 0.0
    points = sorted({(1.0 / m.in_flight, 1.0 / m.decode_tokens_per_s) for m in runs if m.in_flight and m.decode_tokens_per_s})
    if len(points) >= 2:
        a, b = fit_line(points)           # 1/X = b + a/c: peak 1/b, half saturation a/b
        if b > 0:
            decode, half = 1.0 / b, a / b
    return Cluster(trainer_nodes=small.world, ranks_per_node=1, parallel_ranks=parallel_ranks,
                   train_tokens_per_s=tokens_per_s, update_fixed_s=fixed, update_comm_s=comm, replicas=1,
                   decode_tokens_per_s=decode, half_saturation=half, stream_tokens_per_s=small.stream_tokens_per_s,
                   in_flight=small.in_flight, weights_gb=small.weights_gb, publish_gb_per_s=publish_gb_per_s,
                   publish_fixed_s=max(0.0, small.publish_s - small.weights_gb / publish_gb_per_s),
                   sync_gb_per_s=sync_gb_per_s, sync_fixed_s=max(0.0, small.sync_s - small.weights_gb / sync_gb_per_s),
                   shared_compute=shared_compute)


def overlap_efficiency(on: Measured, off: Measured, cluster: Cluster) -> float:
    """How much of the ideal overlap a one-step-off-policy run got, from a measured on-policy and
    one-step-off-policy pair on the same cluster: (on - off) / (on - ideal off), clipped to [0, 1].
    On dedicated nodes it is near 1; where trainer and server share cores (this machine's local
    cluster) near 0. The model then applies the same share to k >= 2 (Cluster.overlap)."""
    from dataclasses import replace

    from tbhpc.plan.model import step_time
    c = replace(cluster, trainer_nodes=off.world, in_flight=off.in_flight, shared_compute=False, overlap=1.0)
    predicted_on, ideal = step_time(off.workload, c, 0).step_s, step_time(off.workload, c, 1).step_s
    if predicted_on <= ideal:
        return 0.0
    gained = (on.step_s * predicted_on / max(step_time(on.workload, c, 0).step_s, 1e-9)) - off.step_s
    return max(0.0, min(1.0, gained / (predicted_on - ideal)))
