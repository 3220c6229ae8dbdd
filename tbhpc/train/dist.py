"""Where this trainer process stands: its rank among the trainer's processes, the rendezvous address,
and the GPU it drives (or none).

Why apart from the engine: Slurm, torchrun and a lone process say these things in different
environment variables, and Slurm binds GPUs to tasks in two ways; reading them is pure and tested
on its own, before anything heavy (torch, DeepSpeed) is loaded.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from tbhpc.errors import UserError


@dataclass
class DistEnv:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500

    @classmethod
    def from_environ(cls, env: dict | None = None) -> "DistEnv":
        """Slurm (srun: SLURM_PROCID/NTASKS/LOCALID), torchrun (RANK/WORLD_SIZE/LOCAL_RANK) or one
        process. MASTER_ADDR/MASTER_PORT come from the job script (rank 0's node, a port from the
        job id) or default to this host."""
        e = os.environ if env is None else env
        if "SLURM_PROCID" in e and "SLURM_NTASKS" in e and "RANK" not in e:
            rank, world, local = int(e["SLURM_PROCID"]), int(e["SLURM_NTASKS"]), int(e.get("SLURM_LOCALID", 0))
        else:
            rank, world, local = int(e.get("RANK", 0)), int(e.get("WORLD_SIZE", 1)), int(e.get("LOCAL_RANK", 0))
        if "MASTER_PORT" in e:
            port = int(e["MASTER_PORT"])
        else:   # one process on its own: any free pair (two local runs on one machine must not collide)
            port = free_port_pair() if world == 1 else 29500
        return cls(rank, world, local, e.get("MASTER_ADDR", "127.0.0.1"), port)

    def environ(self, device: int | None = None) -> dict[str, str]:
        """The variables torch.distributed and DeepSpeed read. LOCAL_RANK is the index of the GPU this
        rank drives (`device`, from `cuda_device`), not its place on the node: DeepSpeed's engine and
        `zero.Init` take their device from LOCAL_RANK, and where Slurm binds each task one GPU that GPU
        is index 0 for every task, while SLURM_LOCALID runs 0..7 ("invalid device ordinal" on rank 1)."""
        local = self.local_rank if device is None else device
        return {"RANK": str(self.rank), "WORLD_SIZE": str(self.world), "LOCAL_RANK": str(local),
                "MASTER_ADDR": self.master_addr, "MASTER_PORT": str(self.master_port)}

    def export(self) -> None:
        os.environ.update(self.environ())


def free_port_pair() -> int:
    """A port p with p and p + 1 free on this host (the rendezvous and the draw queue's store), below
    the kernel's ephemeral range (32768-60999 on Debian): a port the kernel hands out can be handed
    again, between this check and its use, to a connection (gloo opens many), and the rendezvous then
    fails with EADDRINUSE. Drawn from the system's randomness, not from a `random` a caller seeded."""
    import random
    import socket
    pick = random.SystemRandom()
    for _ in range(200):
        port = pick.randint(20000, 32000)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue
    return 29500


def cuda_device(local_rank: int, visible: int, local_world: int | None, cuda_visible: str | None = None) -> int:
    """The GPU index this rank drives, among those it sees. Slurm either shows every task of a node
    all its GPUs (`--gpus-per-node`: rank i takes GPU i) or binds each task its own (`--gpus-per-task=1`,
    `--gpu-bind`: each rank sees one, index 0). `local_world`: the ranks on this node, when known."""
    where = f"(local rank {local_rank}, CUDA_VISIBLE_DEVICES={cuda_visible!r})"
    if visible < 1:
        raise UserError(f"this trainer rank sees no GPU {where}: ask Slurm for GPUs (gpus_per_node) or run on CPU nodes")
    if visible == 1:
        return 0
    if (local_world is None or visible >= local_world) and local_rank < visible:
        return local_rank
    raise UserError(f"this trainer rank sees {visible} GPUs {where} while its node runs {local_world or '?'} ranks: "
                    f"give each task one GPU (--gpus-per-task=1) or every task all of the node's GPUs")


def bind_gpu(env: DistEnv, visible: int, environ: dict | None = None) -> int:
    """The GPU index this rank drives (`cuda_device` over what the task sees), exported with the rest
    of `env` so that DeepSpeed, which reads LOCAL_RANK, drives the same one. Call before NCCL starts."""
    e = os.environ if environ is None else environ
    device = cuda_device(env.local_rank, visible, local_world_size(e), e.get("CUDA_VISIBLE_DEVICES"))
    e.update(env.environ(device))
    return device


def local_world_size(env: dict | None = None) -> int | None:
    """Ranks on this node: torchrun's LOCAL_WORLD_SIZE, or Slurm's tasks per node."""
    e = os.environ if env is None else env
    for key in ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"):
        if str(e.get(key, "")).isdigit():
            return int(e[key])
    return None


def use_gpu() -> bool:
    try:
        import torch
        return torch.cuda.is_available() and os.environ.get("DS_ACCELERATOR", "") != "cpu"
    except ImportError:  # pragma: no cover
        return False
