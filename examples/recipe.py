"""The recipe from Python: probe the base policy, select the policy-relative pool, evaluate, compare.

    python examples/recipe.py --out runs/example                 # submitit's AutoExecutor: Slurm if there is one
    python examples/recipe.py --out runs/example --local         # worker processes here (no submitit)

Every call is what the matching `tbhpc` command runs (tbhpc.api); the numbers are the same.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from tbhpc import api


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--local", action="store_true", help="tbhpc's local executor instead of submitit")
    ap.add_argument("--limit", type=int, default=12, help="tasks per campaign (a small, quick run)")
    ap.add_argument("--partition", default=None, help="Slurm partition (submitit)")
    args = ap.parse_args()

    executor = "local"
    if not args.local:
        import submitit
        executor = submitit.AutoExecutor(folder=args.out / "submitit")        # Slurm if sbatch is there, else local
        executor.update_parameters(timeout_min=30, slurm_array_parallelism=8,
                                   **({"slurm_partition": args.partition} if args.partition else {}))

    # 1. probe the base policy (an oracle that is right ~60% of the time stands in for a model)
    probe = api.probe(out=args.out / "probe", executor=executor, wait=args.local,     # submitit: returns at once
                      split="train", limit=args.limit, repeats=4, chunk_size=8, policy_opts={"skill": 0.6})
    if probe.jobs:
        print(f"probe: {len(probe.jobs)} array task(s) submitted; waiting")
        probe = probe.wait()
    print(f"probe: {probe.done}/{probe.planned} attempts, config {probe.config_hash}")

    # 2. the policy-relative pool: Jeffreys bands, the middle three kept
    sel = api.select(probe, out=args.out / "pool.yaml", min_clean_runs=3)
    print(f"pool: {len(sel.pool)} of {args.limit} tasks ({', '.join(f'{b} {n}' for b, n in sel.band_counts.items())})")

    # 3. evaluate two policies on the held-out split and compare them on the same tasks
    base = api.evaluate(out=args.out / "eval-base", executor=executor, limit=args.limit, repeats=4,
                        policy_opts={"skill": 0.6})
    better = api.evaluate(out=args.out / "eval-better", executor=executor, limit=args.limit, repeats=4,
                          policy_opts={"skill": 0.8})
    for name, run in (("base", base), ("better", better)):
        s = api.agg(run, bootstrap=0)
        print(f"{name}: pass@1 {s['pass@1']['value']:.3f} over {s['attempts']} attempts")
    diff = api.compare(better, base, bootstrap=200)
    print(f"compare: {diff['shared_tasks']} shared tasks")
    failed = api.results(base).filter("NOT passed").project("task_id, attempt_index").limit(1).fetchall()
    if failed:
        print(api.show(base, failed[0][0], failed[0][1]).splitlines()[0])


if __name__ == "__main__":
    main()
