"""One step's draws, shared by every rank: claim the next draw, report its outcome, know when
the step has enough informative groups.

Why a shared counter and not a fixed split: episodes differ 10-100x in length, so a rank that got
its share up front idles while another finishes a slow group. Here each rank's workers claim draw
indices one at a time from a counter in torch's key-value store (the TCPStore the process group
already relies on; an in-process HashStore on one rank), so a fast rank simply claims more.

Why the decision is by draw order, not arrival order: the step keeps the first B informative
groups *in draw order* (the cutoff is the index of the B-th one). Which groups a step trains on
is then a function of (seed, step) alone, whatever the number of ranks or their speed, which is
what makes a requeued run reach the same weights. Groups claimed past the cutoff are surplus:
they stop between episodes and are discarded.

Why a bound on draws ahead (`ahead`): every rank's workers claim as long as fewer than B
informative groups are known, so with W groups in flight a step ends with up to W - 1 of them
surplus, which on a CPU (or any generator whose throughput is shared) slows the groups that are
kept. With `ahead` = a, a draw is claimed only while (informative groups known + groups in
flight) < B + a: a flat or dropped group frees the slot its worker then claims, a mixed one does
not. Which groups are kept is unchanged (still the first B in draw order); only the waste is.
"""
from __future__ import annotations

import threading

MIXED, FLAT, DROPPED = "mixed", "flat", "dropped"   # informative | zero-variance | a system failure nobody could cure


def decide(statuses: list[str | None], need: int, cap: int) -> int | None:
    """The cutoff: index of the `need`-th informative group in draw order, once every draw before
    it is known; the last index when `cap` draws are all known without enough; else None."""
    mixed = 0
    for i, status in enumerate(statuses[:cap]):
        if status is None:
            return None
        mixed += status == MIXED
        if mixed == need:
            return i
    return cap - 1 if len(statuses) >= cap and cap > 0 else None


class DrawQueue:
    def __init__(self, store, step: int, need: int, cap: int, ahead: int | None = None):
        self.store, self.need, self.cap, self.ahead = store, need, cap, ahead
        self.prefix = f"step{step}/"
        self._lock = store_lock(store)     # one thread at a time talks to the store (TCPStore clients are not thread-safe),
                                           # also across two steps' queues (one step off-policy runs them at once)
        self._known: list[str | None] = []
        self._cutoff: int | None = None

    def claim(self) -> int | None:
        """The next draw index to run, or None when the step is decided, aborted or at its cap, or
        when B informative groups are already known: a later draw can then never be kept (the
        first B in draw order are all at or before the known ones), so claiming it is waste; also
        None when `ahead` is set and the groups in flight could already complete the step."""
        if self.cutoff() is not None or self.aborted():
            return None
        with self._lock:
            mixed = int(self.store.add(self.prefix + "mixed", 0))
            if mixed >= self.need:
                return None
            # read, then claimed: across ranks two may both take the last free slot (a bound on waste, not exact)
            if self.ahead is not None and mixed + int(self.store.add(self.prefix + "inflight", 0)) >= self.need + self.ahead:
                return None
            i = int(self.store.add(self.prefix + "next", 1)) - 1
            if i >= self.cap:
                return None
            self.store.add(self.prefix + "inflight", 1)
        return i

    def report(self, index: int, status: str) -> None:
        """A claimed draw's outcome (mixed, flat or dropped); it is no longer in flight."""
        with self._lock:
            self.store.set(f"{self.prefix}r{index}", status)
            if status == MIXED:
                self.store.add(self.prefix + "mixed", 1)
            self.store.add(self.prefix + "inflight", -1)

    def release(self, index: int) -> None:
        """A claimed draw that ended surplus (past the cutoff): no outcome, no longer in flight."""
        with self._lock:
            self.store.add(self.prefix + "inflight", -1)

    def cutoff(self) -> int | None:
        """The decided cutoff (None while undecided); reads the outcomes other ranks reported."""
        if self._cutoff is not None:
            return self._cutoff
        with self._lock:
            if self.store.check([self.prefix + "cutoff"]):
                self._cutoff = int(self.store.get(self.prefix + "cutoff"))
                return self._cutoff
            while len(self._known) < self.cap:
                key = f"{self.prefix}r{len(self._known)}"
                if not self.store.check([key]):
                    break
                self._known.append(self.store.get(key).decode())
            cut = decide(self._known, self.need, self.cap)
            if cut is not None:
                self.store.set(self.prefix + "cutoff", str(cut))
                self._cutoff = cut
        return self._cutoff

    def progress(self) -> tuple[int, int]:
        """(draws claimed, mixed groups reported) so far, over every rank."""
        with self._lock:
            return int(self.store.add(self.prefix + "next", 0)), int(self.store.add(self.prefix + "mixed", 0))

    def abort(self) -> None:
        """Every rank stops claiming (a preemption signal reached one of them)."""
        with self._lock:
            self.store.set(self.prefix + "abort", "1")

    def aborted(self) -> bool:
        with self._lock:
            return self.store.check([self.prefix + "abort"])

    def surplus(self, index: int) -> bool:
        cut = self.cutoff()
        return cut is not None and index > cut


_STORE_LOCKS: dict[int, threading.RLock] = {}
_GUARD = threading.Lock()


def store_lock(store) -> threading.RLock:
    """The one lock of a store object (the trainer's store lives as long as its process)."""
    with _GUARD:
        return _STORE_LOCKS.setdefault(id(store), threading.RLock())


def make_store(rank: int, world: int, host: str = "127.0.0.1", port: int = 0):
    """HashStore on one rank; a TCPStore served by rank 0 otherwise."""
    import datetime

    import torch.distributed as dist
    if world == 1:
        return dist.HashStore()
    return dist.TCPStore(host, port, world, is_master=rank == 0, timeout=datetime.timedelta(hours=2))
