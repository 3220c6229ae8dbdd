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

NCCL is not gloo, and the wire is written for NCCL's rules (tests/nccl_standin.py plays them on CPUs):
- `work.wait()` only makes the current CUDA stream wait; the host goes on. Whatever reads the
  buffers on that stream (vLLM's loaders) is ordered after the data, but the host may not drop the
  group or call a transfer done until the last collective has completed (`settle`): a
  ProcessGroupNCCL destroyed without `shutdown()` aborts the kernels still running.
- NCCL does not compare sizes: two ranks in collectives of different sizes hang until the timeout.
  So both sides always run the same sequence of collectives, whatever fails: a receiver whose loader
  fails takes the rest of the stream anyway (`drain`), and a sender whose stream fails sends the
  rest as zeros; the closing byte then says whether the stream was whole, and nobody trusts a part.
- A group that NCCL refuses to form (different NCCL versions, two ranks on one GPU, wrong IB
  settings) raises DistBackendError: the caller falls back to files, it never ends a job.

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


def first_line(exc: BaseException) -> str:
    """`Type: first line of the message` (NCCL's errors run to many lines; some have none)."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def process_group(store, rank: int, world: int, device: torch.device, timeout: timedelta):
    """gloo on CPUs, NCCL on GPUs (a test replaces this with a stand-in that behaves as NCCL does)."""
    import torch.distributed as dist
    if device.type == "cpu":
        return dist.ProcessGroupGloo(store, rank, world, timeout)
    opts = dist.ProcessGroupNCCL.Options()
    opts._timeout = timeout
    return dist.ProcessGroupNCCL(store, rank, world, opts)


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
        self._last = None              # the newest collective's Work: done means every earlier one is
        self.buckets_done = 0          # buckets this member has taken part in (`drain` runs the rest)
        self.whole: bool | None = None  # after `close`: the sender's word on the stream

    def _form(self) -> None:
        import torch.distributed as dist
        self.pg = process_group(dist.PrefixStore(PREFIX, self.store), self.rank, self.world, self.device, self.timeout)
        self._prove()

    def _proof(self, rank: int, nonces: bytes) -> bytes:
        return hmac.new(self._token, b"tbhpc-weights|%d|" % rank + nonces, hashlib.sha256).digest()

    def _allgather(self, data: bytes) -> list[bytes]:
        mine = torch.tensor(list(data), dtype=torch.uint8, device=self.device)
        out = [torch.empty_like(mine) for _ in range(self.world)]
        self._last = self.pg.allgather([out], [mine])
        self._last.wait()
        self.settle()                  # the host reads the result
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
        """Queued: on NCCL the data has landed once `settle` returns, not when this does."""
        import torch.distributed as dist
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        self._last = self.pg.broadcast([buf], opts)
        self._last.wait()

    def settle(self, poll_s: float = 0.001) -> None:
        """Block the host until every collective queued so far has completed (and, on a GPU, whatever
        the stream queued behind them: vLLM's copies), within the group's timeout (TimeoutError)."""
        if self._last is not None:
            deadline = time.monotonic() + self.timeout.total_seconds()
            while not self._last.is_completed():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"weight broadcast: a collective did not complete within "
                                       f"{self.timeout.total_seconds():g} s")
                time.sleep(poll_s)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def drain(self, meta: list[dict], bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> None:
        """Take part in the stream's remaining buckets without keeping them (a receiver whose loader
        failed, a sender whose tensors did: zeros), so that every member runs the same collectives."""
        buckets = plan_buckets(meta, bucket_bytes)[self.buckets_done:]
        if not buckets:
            return
        scratch = torch.zeros(max(sum(nbytes(meta[i]) for i in b) for b in buckets), dtype=torch.uint8, device=self.device)
        for bucket in buckets:
            self.broadcast(scratch[:sum(nbytes(meta[i]) for i in bucket)])
            self.buckets_done += 1

    def abort(self) -> None:
        """Drop the group without waiting for anything (its collectives are ended where they stand)."""
        pg, self.pg, self._last, self.store = self.pg, None, None, None
        if pg is not None:
            pg.abort()

    def close(self, whole: bool = True) -> bool:
        """Ends the sync for everyone at once: a last one-byte broadcast, the sender's word on whether
        the stream was whole (`whole`; a receiver's argument is ignored), then the group is shut down
        once everything has landed. Returns the sender's word. A collective that never completes
        (a member gone) aborts the group instead: TimeoutError."""
        settled = False
        try:
            if self.pg is not None:
                word = torch.tensor([0 if whole else 1], dtype=torch.uint8, device=self.device)
                self.broadcast(word)
                self.settle()
                settled = True
                self.whole = int(word.cpu()[0]) == 0
        finally:
            pg, self.pg, self._last = self.pg, None, None
            if pg is not None:
                (pg.shutdown if settled else pg.abort)()
            self.store = None
        return bool(self.whole)


def listen(host: str, world: int, device: str, timeout_s: float, token: str, port: int = 0) -> Group:
    """The sender's side of the rendezvous (port 0: a free one, then `group.port`)."""
    return Group(host, port, 0, world, device, timeout_s, token)


def send(group: Group, meta: list[dict], tensors: Iterable[torch.Tensor], bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> int:
    """Broadcast `tensors` (in `meta`'s order, each matching its entry) and close the group; returns
    the bytes sent once they have landed. A stream that fails on the way (a tensor unlike its entry,
    the producer raising) still runs every bucket, as zeros, and closes saying it is not whole, so
    that no receiver hangs in a collective of another size or keeps a part: then it raises."""
    it = iter(tensors)
    sent = 0
    try:
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
            group.buckets_done += 1
            sent += buf.numel()
        for _ in it:              # runs the producer to its end (a digesting wrapper finishes there)
            raise ValueError(f"weight broadcast: more tensors than the {len(meta)} announced")
    except BaseException:
        if group.pg is not None:
            try:
                group.drain(meta, bucket_bytes)
                group.close(whole=False)
            except Exception:      # the group itself broke: the stream's own error says more
                group.abort()
        raise
    group.close()
    return sent


def receive(group: Group, meta: list[dict], bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) in `meta`'s order as the buckets arrive; each bucket is a fresh buffer, so a
    loader may keep the tensors it was given. On a GPU the data is there for work queued on the
    stream (a copy), not yet for the host: `take` settles before it reports."""
    for bucket in plan_buckets(meta, bucket_bytes):
        sizes = [nbytes(meta[i]) for i in bucket]
        buf = torch.empty(sum(sizes), dtype=torch.uint8, device=group.device)
        group.broadcast(buf)
        group.buckets_done += 1
        off = 0
        for i, n in zip(bucket, sizes):
            m = meta[i]
            yield m["name"], buf[off:off + n].view(dtype_named(m["dtype"])).view(m["shape"])
            off += n


def join(host: str, port: int, rank: int, world: int, device: str, timeout_s: float, token: str) -> tuple[Group | None, dict]:
    """A receiver's join: (the group, {}) or (None, why not): {"untrusted": ...} when a member could
    not prove the run's token, {"unjoined": ...} when the group did not form (NCCL refused it:
    DistBackendError; a rendezvous that timed out). Never raises: in a vLLM worker an exception
    inside an RPC ends the engine, and a sync that cannot happen must leave the server serving."""
    try:
        return Group(host, port, rank, world, device, timeout_s, token).join(), {}
    except PermissionError as exc:
        return None, {"untrusted": str(exc)}
    except Exception as exc:        # DistBackendError, DistStoreError, TimeoutError, RuntimeError
        return None, {"unjoined": first_line(exc)}


def take(group: Group, meta: list[dict], bucket_bytes: int, load) -> dict:
    """A receiver's whole stream: `load(stream)` consumes (name, tensor) pairs (vLLM's reload) and
    returns its report. Whatever fails, the rest of the stream is taken (`drain`) and the group
    closed, so the sender is never left hanging; the report then says "failed" and why (the served
    weights are a mix: the caller must not trust them). Timings are of data that has landed."""
    t0 = time.perf_counter()
    got = {"bytes": 0}

    def stream():
        for name, t in receive(group, meta, bucket_bytes):
            got["bytes"] += t.numel() * t.element_size()
            yield name, t

    report: dict = {}
    failed = ""
    try:
        report = load(stream()) or {}
    except Exception as exc:
        failed = f"{type(exc).__name__}: {exc}"
    try:
        group.drain(meta, bucket_bytes)
        whole = group.close()
    except Exception as exc:        # the group itself broke (a member gone): nothing more can be asked of it
        group.abort()
        failed = failed or f"{type(exc).__name__}: {exc}"
        whole = True
    if not failed and not whole:
        failed = "the sender's stream failed part way (its trainer says why); the buckets after it were zeros"
    report.update({"receive_s": round(time.perf_counter() - t0, 4), "bytes": got["bytes"]})
    if failed:
        report["failed"] = failed
    return report
