"""Fan-out: one campaign of >= 10,000 attempts (fast scripted policy) through the local process
pool, a Slurm array and MPI mode on this machine's local cluster; wall time, attempts/s, and the
number of sbatch / squeue / sacct calls each made. Target: Slurm within 1.3x of local wall time.

Needs the local cluster: `make slurm-up` and `. /tmp/tbhpc-slurm/env.sh` (or run through
`bash slurm/local/with-cluster.sh python bench/fanout.py`).

Usage: python bench/fanout.py [--repeats 80] [--workers 2] [--tasks-per-slot 1]
"""
from __future__ import annotations

import argparse
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from tbhpc.campaign.runner import run_campaign
from tbhpc.campaign.config import CampaignConfig
from tbhpc.slurm_options import SlurmOptions
from tbhpc.launch.slurm import MPIExecutor, SlurmClient, SlurmExecutor


def slots() -> int:
    import subprocess
    out = subprocess.run(["sinfo", "-h", "-p", "batch", "-o", "%C"], capture_output=True, text=True, check=True).stdout
    return int(out.strip().split("/")[-1])  # allocated/idle/other/total CPUs


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=80, help="repeats of the 134 eval tasks (80 -> 10,720 attempts)")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    console = Console()
    root = Path(tempfile.mkdtemp(prefix="tbhpc-fanout-"))
    cfg = CampaignConfig(name="fanout", split="eval", repeats=args.repeats, workers=args.workers, chunk_size=200)
    n = 134 * args.repeats
    cpus = slots()
    per_task = math.ceil(n / cpus)  # one array task per CPU slot: minutes-long tasks, not thousands of tiny jobs
    table = Table(title=f"fan-out of {n:,} oracle attempts ({cpus} Slurm CPU slots on {args.workers} real cores)")
    for col in ("executor", "wall s", "att/s", "vs local", "sbatch", "squeue", "sacct", "jobs"):
        table.add_column(col, justify="right")
    try:
        t0 = time.perf_counter()
        run_campaign(cfg, root / "local", console=Console(quiet=True))
        local = time.perf_counter() - t0
        console.print(f"local: {local:.1f} s")
        table.add_row("local", f"{local:.1f}", f"{n / local:.0f}", "1.00x", "0", "0", "0", "-")
        for name, cls, opts in (
            ("slurm", SlurmExecutor, SlurmOptions(attempts_per_task=per_task, array_parallelism=cpus, poll_seconds=1,
                                                        flush_every=200)),
            ("mpi", MPIExecutor, SlurmOptions(attempts_per_task=math.ceil(n / (4 * cpus)), nodes=3, ntasks=cpus,
                                              poll_seconds=1, flush_every=200)),
        ):
            client = SlurmClient()
            t0 = time.perf_counter()
            res = run_campaign(cfg, root / name.split()[0], executor=cls(opts, client, log=lambda *_: None),
                               console=Console(quiet=True))
            wall = time.perf_counter() - t0
            assert res.missing == 0, f"{name}: {res.missing} attempts missing"
            console.print(f"{name}: {wall:.1f} s")
            table.add_row(name, f"{wall:.1f}", f"{n / wall:.0f}", f"{wall / local:.2f}x", str(client.calls["sbatch"]),
                          str(client.calls["squeue"]), str(client.calls["sacct"]),
                          f"1 array x{math.ceil(n / per_task)}" if cls is SlurmExecutor else "1 alloc")
        console.print(table)
        console.print("target: slurm array within 1.3x of local wall time (same machine, same CPUs); "
                      "squeue calls = one batched poll per second for the whole array")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
