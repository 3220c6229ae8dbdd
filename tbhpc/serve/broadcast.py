"""Weight sync by broadcast: the trainer streams its weights into the running server's workers.

The file path (checkpoints.py) moves a 27B model through the file system every step; this one moves
it over a collective (NCCL on GPUs, gloo on CPUs: vllm_ext/tbhpc_wire.py) and is checked exactly as
a file sync is. Protocol (both sides import only this module and tbhpc_wire):
1. the trainer's rank 0 opens a rendezvous and writes `RUN/checkpoints/step-N.offer` (JSON: where
   to join, how many receivers, the tensors' names, shapes and dtypes, the bucket size);
2. the server's supervisor sees the offer, pauses the server and asks every vLLM worker to join
   and receive (`tbhpc_receive`); each loads the tensors as the buckets arrive;
3. the trainer streams the tensors (gathered a module at a time from its ZeRO-3 shards), digesting
   each in the served dtype on the way, then writes the ready marker `step-N.ready` with
   `transport: broadcast`, the digests and the fingerprint, and no path;
4. the supervisor checks what its workers now hold against that marker, as after any sync.
Nobody joins within the offer's timeout (no server, or one restarting), or the group does not form
(NCCL refuses it): the offer is withdrawn and the trainer publishes through files instead, so a
sync never depends on the server being up.
Broadcast markers have no files: a server (re)started later starts from the newest marker that has
them, and the trainer's next publication brings it forward.
"""
from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Iterator

from tbhpc.serve.checkpoints import CKPT_DIR, version_name

OFFER = ".offer"


@dataclass(frozen=True)
class Offer:
    step: int
    host: str
    port: int
    world: int                 # 1 sender + every vLLM worker
    device: str                # cpu (gloo) | cuda (NCCL)
    meta: list                 # [{"name", "shape", "dtype"}] in sending order
    bucket_bytes: int
    offered_at: float
    timeout_s: float

    @property
    def version(self) -> str:
        return version_name(self.step)

    @property
    def nbytes(self) -> int:
        from tbhpc.serve.vllm_ext.tbhpc_wire import nbytes
        return sum(nbytes(m) for m in self.meta)


def offer_path(run_dir: Path | str, step: int) -> Path:
    return Path(run_dir) / CKPT_DIR / f"{version_name(step)}{OFFER}"


def write_offer(run_dir: Path | str, offer: Offer) -> Path:
    path = offer_path(run_dir, offer.step)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{path.name}")
    tmp.write_text(json.dumps(asdict(offer)) + "\n")
    os.replace(tmp, path)
    return path


def latest_offer(run_dir: Path | str, newer_than: float = 0.0) -> Offer | None:
    """The newest offer still open (made after `newer_than`, within its own timeout), or None."""
    best = None
    for path in (Path(run_dir) / CKPT_DIR).glob(f"step-*{OFFER}"):
        try:
            o = Offer(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            continue                            # half-visible or withdrawn meanwhile
        if o.offered_at > newer_than and time.time() < o.offered_at + o.timeout_s and (best is None or o.offered_at > best.offered_at):
            best = o
    return best


def withdraw(run_dir: Path | str, step: int) -> None:
    offer_path(run_dir, step).unlink(missing_ok=True)


def sender_device(gpu: bool) -> str:
    import torch
    return f"cuda:{torch.cuda.current_device()}" if gpu else "cpu"


class Sender:
    """The trainer's side, on rank 0: `open` (offer, wait for the receivers), then `send` the stream."""

    def __init__(self, run_dir: Path | str, step: int, meta: list[dict], receivers: int, device: str,
                 timeout_s: float, bucket_bytes: int, host: str | None = None):
        from tbhpc.serve.auth import read_token, token_path
        from tbhpc.serve.vllm_ext.tbhpc_wire import listen
        self.run, self.step, self.meta, self.bucket_bytes = Path(run_dir), step, meta, bucket_bytes
        self.group = listen("0.0.0.0", receivers + 1, device, timeout_s, read_token(token_path(self.run)))
        self.offer = Offer(step, host or socket.gethostname(), self.group.port, receivers + 1,
                           "cpu" if device == "cpu" else "cuda", meta, bucket_bytes, time.time(), timeout_s)
        write_offer(self.run, self.offer)
        self.join_s = 0.0
        self.refused = ""                   # why a group that formed was not trusted (tbhpc_wire's proof)

    def wait_joined(self, timeout_s: float) -> bool:
        """True when every receiver joined and proved the run's token; else the offer is withdrawn
        (publish through files)."""
        t0 = time.monotonic()
        try:
            ok = self.group.wait_joined(timeout_s)
        except PermissionError as exc:
            ok, self.refused = False, str(exc)
        except Exception as exc:        # NCCL refused the group (DistBackendError: versions, a GPU twice, IB)
            from tbhpc.serve.vllm_ext.tbhpc_wire import first_line
            ok, self.refused = False, f"weight broadcast: the group did not form ({first_line(exc)})"
        self.join_s = time.monotonic() - t0
        if not ok:
            withdraw(self.run, self.step)
            self.group.abort()          # nothing was sent: nothing to wait for
        return ok

    def send(self, tensors: Iterable) -> int:
        """The stream, closed once every byte has landed (the time to here is the transfer's)."""
        from tbhpc.serve.vllm_ext.tbhpc_wire import send
        try:
            return send(self.group, self.meta, tensors, self.bucket_bytes)
        finally:
            withdraw(self.run, self.step)


def digesting(named: Iterator[tuple[str, object]], dtype: str, into: dict, ahead_bytes: int = 1 << 30) -> Iterator[object]:
    """Pass the tensors on, digesting each in `dtype` (what the server must then hold) in a thread
    beside the stream, so the digest costs no stream time while it keeps pace; at most `ahead_bytes`
    wait for it (they stay alive until digested). `into` is complete, in stream order, at the end."""
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    from tbhpc.serve.vllm_ext.tbhpc_digest import hexd, tensor_digest
    pending: deque = deque()
    waiting = 0
    with ThreadPoolExecutor(1, thread_name_prefix="tbhpc-digest") as pool:
        for name, t in named:
            if t.is_floating_point():
                size = t.numel() * t.element_size()
                pending.append((name, size, pool.submit(lambda t=t: hexd(tensor_digest(t, dtype)))))
                waiting += size
                while waiting > ahead_bytes:
                    done, size, fut = pending.popleft()
                    into[done] = fut.result()
                    waiting -= size
            yield t
        for done, _, fut in pending:
            into[done] = fut.result()
