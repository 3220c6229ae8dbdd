"""Rank 0's trackers, each behind its own queue and thread: training never waits for one.

Why threads: a tracker is a side channel. A full disk, a read-only directory, a missing package
on one node or a server that stops answering must not cost a step, and a blocking call (an HTTP
retry loop, a hung `wandb.init`) cannot be interrupted from outside. So each tracker opens and
logs on a daemon thread; its first failure is one warning line and the tracker is off for the rest
of the run; `close` waits a bounded time and says which tracker it left behind. DuckDB, written
on the training thread, is complete either way.
"""
from __future__ import annotations

import queue
import threading
import time
from typing import Callable

from tbhpc.track.backends import BACKENDS, RunIdentity

_STOP = object()


class _Worker(threading.Thread):
    def __init__(self, name: str, ident: RunIdentity, warn: Callable[[str], None]):
        super().__init__(name=f"tracker-{name}", daemon=True)
        self.tracker, self.identity, self.warn = name, ident, warn
        self.jobs: queue.Queue = queue.Queue()
        self.failed = False

    def run(self) -> None:
        backend = None
        try:
            backend = BACKENDS[self.tracker](self.identity)
            while (job := self.jobs.get()) is not _STOP:
                method, args = job
                getattr(backend, method)(*args)
            backend.close()
        except BaseException as exc:   # noqa: BLE001 - any failure of a side channel: one line, then off
            self.failed = True
            what = "open" if backend is None else "log to"
            self.warn(f"tbhpc: warning: tracker {self.tracker}: could not {what} it ({type(exc).__name__}: "
                      f"{_one_line(exc)}); it is off for the rest of this run, results.duckdb has every step")


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 160 else text[:157] + "..."


class Trackers:
    """Every tracker a run names. `scalars`, `table` return at once; `close` waits at most
    `timeout_s` for all of them together."""

    def __init__(self, names: list[str], ident: RunIdentity, warn: Callable[[str], None] = print):
        self.warn = warn
        self.workers = [_Worker(n, ident, warn) for n in names]
        for w in self.workers:
            w.start()

    def scalars(self, step: int, values: dict[str, float]) -> None:
        self._put("scalars", (step, values))

    def evals(self, step: int, values: dict[str, float]) -> None:
        """Eval metrics of the export of `step`: on their own axis `eval/step` (they may arrive late)."""
        self._put("scalars", (step, {"eval/step": step, **values}))

    def table(self, step: int, key: str, columns: list[str], rows: list[list]) -> None:
        self._put("table", (step, key, columns, rows))

    def _put(self, method: str, args: tuple) -> None:
        for w in self.workers:
            if w.is_alive():
                w.jobs.put((method, args))

    def working(self) -> list[str]:
        """The trackers that have not failed (after `close`: those whose record is complete)."""
        return [w.tracker for w in self.workers if not w.failed and not w.is_alive()]

    def close(self, timeout_s: float = 60.0) -> None:
        for w in self.workers:
            w.jobs.put(_STOP)
        deadline = time.monotonic() + timeout_s
        for w in self.workers:
            w.join(max(0.0, deadline - time.monotonic()))
            if w.is_alive():
                self.warn(f"tbhpc: warning: tracker {w.tracker}: still busy after {timeout_s:g} s (a server that "
                          "stops answering?); left behind, its record may lack the last entries; results.duckdb "
                          "has every step")
