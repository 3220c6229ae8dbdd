"""Predicted time of one weight sync, by transport and phase, from stated rates (pure: golden-tested).

Why in the plan: on-policy, every step waits for its sync; at 27B a file-system sync is minutes
and a broadcast seconds, and a user should see that before the allocation starts, with the rates
it rests on. Rates for the phases this machine can run (digest per CPU thread, gloo broadcast,
safetensors write and read) are measured by `make bench` (docs/weight-sync.md); the GPU-cluster
rates below are assumptions, each with its source, and the plan says so where it prints them.
"""
from __future__ import annotations

from dataclasses import dataclass

GB = 1e9


@dataclass(frozen=True)
class SyncRates:
    """GB/s of each phase (per process unless said otherwise)."""
    gather: float = 100.0           # ZeRO-3 all-gather of bf16 parameters within a node (NVLink; assumed)
    gpu_digest: float = 100.0       # the exact digest on a GPU (a few int64 passes at HBM speed; assumed)
    broadcast: float = 8.25         # NCCL broadcast trainer -> vLLM over InfiniBand (verl's measured 30B sync)
    load: float = 50.0              # vLLM copying received tensors into its parameters, on the GPU (assumed)
    device_to_host: float = 20.0    # a rank's share gathered to host memory over PCIe (assumed)
    cpu_digest: float = 0.22        # the digest per CPU thread (measured here: bench/sync_transport.py, AVX-512 Xeon)
    fs_write: float = 2.0           # one node writing to a parallel file system (assumed; Lustre/GPFS client)
    fs_read: float = 2.0            # one node reading it back
    threads: int = 16               # digest threads per rank on a GPU node


@dataclass(frozen=True)
class SyncPlan:
    transport: str
    phases: tuple[tuple[str, float], ...]

    @property
    def seconds(self) -> float:
        return sum(s for _, s in self.phases)


def predict(model_bytes: float, trainer_nodes: int, ranks: int,
            rates: SyncRates = SyncRates()) -> tuple[SyncPlan, SyncPlan]:
    """(broadcast, files) for `model_bytes` of served weights. Broadcast: gathered a module at a
    time, digested on rank 0's GPU, one NCCL stream to every vLLM worker, loaded in place. Files:
    every rank gathers its share to host, digests it on its threads and writes its shard (nodes in
    parallel), the serving nodes read the whole model and load it."""
    b = model_bytes / GB
    broadcast = SyncPlan("broadcast", (("gather", b / rates.gather), ("digest", b / rates.gpu_digest),
                                       ("stream", b / rates.broadcast), ("load", b / rates.load)))
    share = b / max(ranks, 1)
    files = SyncPlan("files", (("gather", b / rates.gather + share / rates.device_to_host),
                               ("digest", share / (rates.cpu_digest * rates.threads)),
                               ("write", b / (rates.fs_write * max(trainer_nodes, 1))),
                               ("read", b / rates.fs_read),
                               ("load", b / rates.load)))
    return broadcast, files


def predict_adapter(adapter_bytes: float, rates: SyncRates = SyncRates()) -> SyncPlan:
    """A LoRA run's adapter-only sync: rank 0 gathers the adapters to host, digests them on its
    threads and writes them (fp32, PEFT's format); the server reads the file and loads it in place."""
    b = adapter_bytes / GB
    return SyncPlan("adapter", (("gather", b / rates.device_to_host), ("digest", b / (rates.cpu_digest * rates.threads)),
                                ("write", b / rates.fs_write), ("read", b / rates.fs_read), ("load", b / rates.load)))


def render(model_bytes: float, plans: tuple[SyncPlan, ...], configured: str) -> list[str]:
    """The plan's weight-sync lines."""
    lines = [f"  weight sync per step ({model_bytes / GB:.1f} GB served; assumed GPU-cluster rates, "
             f"docs/weight-sync.md):"]
    for p in plans:
        parts = ", ".join(f"{name} {s:.1f}" for name, s in p.phases)
        mark = f"  <- {'lora_sync' if p.transport == 'adapter' else 'sync_transport'}" if p.transport == configured else ""
        lines.append(f"    {p.transport:<10} {p.seconds:6.1f} s  ({parts}){mark}")
    return lines
