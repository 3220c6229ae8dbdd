"""OpenMP's wait policy for a process where two threads run torch ops in turn (the trainer and its
in-process generator): without it, each step costs about twice what its work needs on a CPU.

Why: torch's CPU kernels run on OpenMP (libgomp), and every thread that runs a parallel region owns
a team of worker threads. The trainer's main thread (the update) and the batched generator's
thread (the rollouts) each have one, so the process manages more OpenMP threads than there are
cores, and libgomp then *throttles* spinning: a worker that finishes a parallel region sleeps on a
futex after ~1,000 spins instead of ~300,000, and every one of the thousands of small kernels of a
step pays a wake-up. The two teams never run at once (generation and update alternate on-policy),
so there is nothing to share the cores with. `bench/omp_teams.py` shows the effect alone.

`OMP_WAIT_POLICY=ACTIVE` with `GOMP_SPINCOUNT=300000` is libgomp's own default spin for a process
that is not oversubscribed, applied whatever the thread count. libgomp reads it once, when torch
loads it, so it is set before anything imports torch; a user's own setting of either wins.
Not for threads that run torch ops *at the same time* (one-step off-policy in one process): there
the teams should be sized to share the cores instead.
"""
from __future__ import annotations

import os
import sys
from typing import Mapping

SPIN_POLICY = {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "300000"}


def spin_policy_updates(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables to set: none when the user chose a wait policy or a spin count."""
    if any(k in environ for k in SPIN_POLICY):
        return {}
    return dict(SPIN_POLICY)


def keep_workers_spinning() -> dict[str, str]:
    """Set the spin policy in this process's environment (inherited by its children); returns what
    was set. Without effect once torch is imported, so it says so instead of pretending."""
    updates = spin_policy_updates(os.environ)
    if updates and "torch" in sys.modules:
        return {}
    os.environ.update(updates)
    return updates
