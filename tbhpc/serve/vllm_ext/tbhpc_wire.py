"""Weights over a collective: the trainer's rank 0 broadcasts, every vLLM worker receives.

Why: publishing through the file system moves a 27B model four times (gather to one rank, write,
read, load) at file-system speed, minutes per step; peers (verl, TRL, OpenRLHF) broadcast over
NCCL in seconds. This module is the wire both sides share (imports only torch, like tbhpc_digest):
- a process group of its own per sync, built from a TCPStore the sender hosts (gloo on CPUs, NCCL
  on GPUs), never the default group (vLLM's workers and DeepSpeed's ranks already own theirs).
  One group per sync, not one per run: either side may be requeued or restarted between syncs,
  and a rendezvous costs milliseconds against the seconds the tensors take;
- tensors travel in buckets of whole tensors' bytes (a 27B model has ~800 tensors, half of them
  small norms: one broadcast each would pay the latency 800 times); both sides cut the same
  buckets from the same metadata (`plan_buckets`), so nothing but bytes crosses the wire.
Every receiver gets every full tensor: vLLM's own loaders cut tensor-parallel shards from them.

The store and the group are torch's and take anyone who connects. So before a byte of weight
moves, every member proves it holds the run's token (serve/auth.py): each contributes a fresh
nonce, then an HMAC of its rank and all the nonces. A group with one member that cannot prove it
ends at once on every side, and nothing is sent. A stranger on the port can make a sync fail,
but can neither read the weights nor feed any (docs/security.md).
"""
from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from datetime import timedelta
from typing import Iterable, Iterator

import torch

PREFIX = "tbhpc-weights"
DEFAULT_BUCKET_BYTES = 256 << 20


def dtype_named(name: str) -> torch.dtype:
    dt = getattr(torch, str(name).removeprefix("torch."), None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"weight broadcast: unknown dtype {name!r}")
    return dt


def meta_of(name: str, t: torch.Tensor) -> dict:
    return {"name": name, "shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")}


def nbytes(meta: dict) -> int:
    n = 1
    for d in meta["shape"]:
        n *= int(d)
    return n * torch.empty((), dtype=dtype_named(meta["dtype"])).element_size()


def plan_buckets(meta: list[dict], bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> list[list[int]]:
    """Consecutive tensors grouped until a bucket reaches `bucket_bytes` (a larger tensor travels alone)."""
    out: list[list[int]] = []
    size = 0
    for i, m in enumerate(meta):
        n = nbytes(m)
        if out and size + n <= bucket_bytes:
            out[-1].append(i)
            size += n
        else:
            out.append([i])
            size = n
    return out


class Group:
    """A process group of `world` members for one sync; rank 0 sends and hosts the store. Receivers
    `join()`; the sender `wait_joined()` (bounded), so a sender whose receivers never come gives up
    before any tensor is gathered for them."""

    def __init__(self, host: str, port: int, rank: int, world: int, device: str, timeout_s: float, token: str):
        import torch.distributed as dist
        if len(token) < 32:
            raise ValueError("weight broadcast: no run token to prove membership with")
        self.timeout = timedelta(seconds=timeout_s)
        self.rank, self.world, self.device, self._token = rank, world, torch.device(device), token.encode()
        self.store = dist.TCPStore(host, port, world, is_master=rank == 0, timeout=self.timeout, wait_for_workers=False)
        self.port = self.store.port
        self.pg = None

    def _form(self) -> None:
        import torch.distributed as dist
        prefixed = dist.PrefixStore(PREFIX, self.store)
        if self.device.type == "cpu":
            self.pg = dist.ProcessGroupGloo(prefixed, self.rank, self.world, self.timeout)
        else:
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = self.timeout
            self.pg = dist.ProcessGroupNCCL(prefixed, self.rank, self.world, opts)
        self._prove()

    def _proof(self, rank: int, nonces: bytes) -> bytes:
        return hmac.new(self._token, b"tbhpc-weights|%d|" % rank + nonces, hashlib.sha256).digest()

    def _allgather(self, data: bytes) -> list[bytes]:
        mine = torch.tensor(list(data), dtype=torch.uint8, device=self.device)
        out = [torch.empty_like(mine) for _ in range(self.world)]
        self.pg.allgather([out], [mine]).wait()
        return [bytes(t.cpu().tolist()) for t in out]

    def _prove(self) -> None:
        """Every member proves the run's token to every other (fresh nonces from all, so no proof
        can be replayed); PermissionError naming the ranks that could not, and nothing is sent."""
        nonces = b"".join(self._allgather(secrets.token_bytes(32)))
        proofs = self._allgather(self._proof(self.rank, nonces))
        bad = [r for r, p in enumerate(proofs) if not hmac.compare_digest(p, self._proof(r, nonces))]
        if bad:
            self.pg = None                  # no closing broadcast: the group is not trusted
            raise PermissionError(f"weight broadcast: group rank(s) {bad} of {self.world} did not prove the run's "
                                  "token; nothing was sent")

    def join(self) -> "Group":
        self.store.add("joined", 1)
        self._form()
        return self

    def wait_joined(self, timeout_s: float, poll_s: float = 0.05) -> bool:
        """True once every receiver joined (the group then forms); False after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while self.store.add("joined", 0) < self.world - 1:
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll_s)
        self._form()
        return True

    def broadcast(self, buf: torch.Tensor) -> None:
        import torch.distributed as dist
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        self.pg.broadcast([buf], opts).wait()

    def close(self) -> None:
        """Ends the sync for everyone at once (a last one-byte broadcast), then drops the store."""
        try:
            if self.pg is not None:
                self.broadcast(torch.zeros(1, dtype=torch.uint8, device=self.device))
        finally:
            self.pg = None
            self.store = None


def listen(host: str, world: int, device: str, timeout_s: float, token: str, port: int = 0) -> Group:
    """The sender's side of the rendezvous (port 0: a free one, then `group.port`)."""
    return Group(host, port, 0, world, device, timeout_s, token)


def send(group: Group, meta: list[dict], tensors: Iterable[torch.Tensor], bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> int:
    """Broadcast `tensors` (in `meta`'s order, each matching its entry); returns the bytes sent."""
    it = iter(tensors)
    sent = 0
    for bucket in plan_buckets(meta, bucket_bytes):
        parts = []
        for i in bucket:
            t = next(it)
            m = meta[i]
            if list(t.shape) != m["shape"] or str(t.dtype).removeprefix("torch.") != m["dtype"]:
                raise ValueError(f"weight broadcast: {m['name']} is {tuple(t.shape)} {t.dtype}, announced "
                                 f"{tuple(m['shape'])} {m['dtype']}")
            parts.append(t.detach().to(group.device).contiguous().reshape(-1).view(torch.uint8))
        buf = parts[0] if len(parts) == 1 else torch.cat(parts)
        group.broadcast(buf)
        sent += buf.numel()
    for _ in it:              # runs the producer to its end (a digesting wrapper finishes there)
        raise ValueError(f"weight broadcast: more tensors than the {len(meta)} announced")
    return sent


def receive(group: Group, meta: list[dict], bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) in `meta`'s order as the buckets arrive; each bucket is a fresh buffer, so a
    loader may keep the tensors it was given."""
    for bucket in plan_buckets(meta, bucket_bytes):
        sizes = [nbytes(meta[i]) for i in bucket]
        buf = torch.empty(sum(sizes), dtype=torch.uint8, device=group.device)
        group.broadcast(buf)
        off = 0
        for i, n in zip(bucket, sizes):
            m = meta[i]
            yield m["name"], buf[off:off + n].view(dtype_named(m["dtype"])).view(m["shape"])
            off += n
