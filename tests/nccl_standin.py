"""A stand-in for NCCL's process group, on CPUs: NCCL needs GPUs, and the weight broadcast's handling
of NCCL (serve/vllm_ext/tbhpc_wire.py) must be tested where the suite runs. The bytes travel over a
real gloo group; around them the stand-in keeps NCCL's rules, as PyTorch's ProcessGroupNCCL and
NCCL document them, where gloo differs:

- completion is asynchronous: `wait()` returns at once (NCCL's makes the current CUDA stream wait,
  not the host); the data lands `delay_s` later, in the order the work was queued (one stream), and
  `is_completed()` says when;
- sizes are not compared: members in a collective of different sizes never complete (NCCL hangs
  until its watchdog's timeout); the stand-in records a "mismatch" and waits to be aborted;
- a group dropped without `shutdown()` aborts (ProcessGroupNCCL's destructor): queued work that has
  not landed never lands ("aborted in flight"); `shutdown()` first lets it land;
- a group NCCL refuses to form raises DistBackendError at the first collective (`refuse`), as a
  mismatched NCCL version or two ranks on one GPU do.

`EVENTS` lists what happened in this process ("mismatch", "aborted in flight", "shutdown").
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

EVENTS: list[str] = []


class _Work:
    def __init__(self, fut):
        self._fut = fut

    def wait(self, timeout=None) -> bool:
        return True                       # the stream waits; the host goes on

    def is_completed(self) -> bool:
        return self._fut.done()


class StandInNCCL:
    def __init__(self, store, rank: int, world: int, timeout, delay_s: float, refuse: str = ""):
        import torch.distributed as dist
        self.rank, self.world, self.delay_s, self.refuse = rank, world, delay_s, refuse
        self.timeout_s = timeout.total_seconds()
        self.sizes = dist.PrefixStore("standin-sizes", store)
        self.gloo = None if refuse else dist.ProcessGroupGloo(dist.PrefixStore("standin-bytes", store), rank, world, timeout)
        self.stream = ThreadPoolExecutor(1, thread_name_prefix="standin-stream")
        self.pending: list = []
        self.seq = 0
        self.aborted = threading.Event()
        self.ended = False

    # -- collectives --------------------------------------------------------------------------------
    def broadcast(self, tensors, opts):
        buf = tensors[0]
        return self._queue(buf.numel() * buf.element_size(), lambda: self.gloo.broadcast(tensors, opts).wait())

    def allgather(self, outs, ins):
        t = ins[0]
        return self._queue(t.numel() * t.element_size(), lambda: self.gloo.allgather(outs, ins).wait())

    def _queue(self, size: int, run):
        if self.refuse:
            import torch.distributed as dist
            raise dist.DistBackendError(self.refuse)
        self.seq += 1
        fut = self.stream.submit(self._land, self.seq, size, run)
        self.pending.append(fut)
        return _Work(fut)

    def _land(self, seq: int, size: int, run) -> None:
        if self.aborted.wait(self.delay_s):
            return
        self.sizes.set(f"{seq}/{self.rank}", str(size))
        sizes = []
        for r in range(self.world):
            key = f"{seq}/{r}"
            while not self.sizes.check([key]):
                if self.aborted.wait(0.01):
                    return
            sizes.append(int(self.sizes.get(key)))
        if len(set(sizes)) > 1:
            EVENTS.append(f"mismatch: collective {seq} of sizes {sizes}")
            self.aborted.wait(self.timeout_s)          # never completes; the watchdog or an abort ends it
            return
        run()

    # -- ending -------------------------------------------------------------------------------------
    def shutdown(self) -> None:
        self.ended = True
        self.stream.shutdown(wait=True)
        EVENTS.append("shutdown")

    def abort(self) -> None:
        if self.ended:
            return
        self.ended = True
        if any(not f.done() for f in self.pending):
            EVENTS.append("aborted in flight")
        self.aborted.set()
        self.stream.shutdown(wait=False, cancel_futures=True)
        if self.gloo is not None:
            self.gloo.abort()

    def __del__(self):
        self.abort()


def install(wire, delay_s: float = 0.1, refuse: str = "") -> None:
    """Make `wire` (tbhpc_wire) form its groups with the stand-in, in this process."""
    def process_group(store, rank, world, device, timeout):
        return StandInNCCL(store, rank, world, timeout, delay_s, refuse)
    wire.process_group = process_group
