"""Which executor runs a campaign's chunks: worker processes here, or Slurm arrays / MPI.

Why in `launch`: the campaign runner takes any `Executor` (campaign/executors.py defines the
interface and the local pool); choosing a Slurm one means building it from the config's `slurm`
section, which is launch's business, so the campaign package never imports launch.
"""
from __future__ import annotations

from tbhpc.campaign.executors import Executor, LocalExecutor
from tbhpc.config import from_dict
from tbhpc.errors import UserError
from tbhpc.launch.slurm import MPIExecutor, SlurmExecutor
from tbhpc.slurm_options import SlurmOptions


def make_executor(name: str, workers: int, slurm: dict | None = None) -> Executor:
    if name == "local":
        return LocalExecutor(workers)
    if name in ("slurm", "mpi"):
        opts = from_dict(SlurmOptions, slurm or {}, {k: "config field 'slurm'" for k in slurm or {}})
        return (SlurmExecutor if name == "slurm" else MPIExecutor)(opts)
    raise UserError(f"--executor: unknown executor {name!r} (choose local, slurm or mpi)")
