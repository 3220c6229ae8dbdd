"""Executors run chunks of attempt keys somewhere. `local` is a process pool on this machine; the
Slurm and MPI executors plug into the same interface (`run(run_path, chunks, on_chunk)`), since a
chunk is always executed by `Worker(run_path).run_chunk(keys)` and lands in its own shard.
"""
from __future__ import annotations

import gc
import multiprocessing as mp
import os
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Callable, Protocol

from tbhpc.campaign.worker import Key, Worker
from tbhpc.errors import InfraError
from tbhpc.interrupts import check as check_interrupt
from tbhpc.interrupts import ignore_in_worker, second_interrupt_exits, stop_children, workers_born_ignoring_sigint

OnChunk = Callable[[int, int], None]  # (ok, system_errors) of one finished chunk


class Executor(Protocol):
    name: str

    def run(self, run_path: Path, chunks: list[list[Key]], on_chunk: OnChunk) -> None: ...


class LocalExecutor:
    """`workers` processes (spawned, one torch thread each); 1 worker runs in this process."""

    name = "local"

    def __init__(self, workers: int = 1):
        self.workers = workers

    def run(self, run_path: Path, chunks: list[list[Key]], on_chunk: OnChunk) -> None:
        if not chunks:
            return
        if self.workers == 1:
            worker = Worker(run_path)
            try:
                for chunk in chunks:
                    check_interrupt()
                    on_chunk(*worker.run_chunk(chunk))
            finally:
                worker.close()          # e.g. stop a launched OpenEnv server now, not at interpreter exit
            return
        ctx = mp.get_context("spawn")
        pool: ProcessPoolExecutor | None = None
        try:
            with workers_born_ignoring_sigint():  # an early Ctrl-C must not hit a worker still importing
                pool = ProcessPoolExecutor(self.workers, mp_context=ctx, initializer=_init, initargs=(str(run_path),))
                pending = {pool.submit(_run_chunk, c) for c in chunks}
            while pending:  # a timeout, so the main thread sees a Ctrl-C even while no chunk ends
                done, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
                check_interrupt()
                for fut in done:
                    on_chunk(*fut.result())
        except BrokenProcessPool as exc:
            pool.shutdown(wait=False, cancel_futures=True)
            raise InfraError("a local worker process died (killed or crashed); finished chunks are "
                             "saved, re-run the same command to complete the missing attempts") from exc
        except BaseException:  # Ctrl-C (or a bug in on_chunk): stop the workers, never wait on them
            with second_interrupt_exits():
                if pool is not None:
                    pool.shutdown(wait=False, cancel_futures=True)
                stop_children()
                if pool is not None:
                    pool.shutdown(wait=True)  # the workers are gone: this only joins the pool's own thread
                pool = None               # its queues' semaphores are released now, not leaked at exit
                gc.collect()
            raise
        pool.shutdown(wait=True)


_WORKER: Worker | None = None


def _init(run_path: str) -> None:
    global _WORKER
    ignore_in_worker()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    _WORKER = Worker(run_path)


def _run_chunk(keys: list[Key]) -> tuple[int, int]:
    assert _WORKER is not None
    return _WORKER.run_chunk(keys)
