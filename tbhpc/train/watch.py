"""No trainer rank waits for a dead or hung peer without bound, and the one that gives up says who.

Why not only the process group's timeout: ranks that finish their rollouts early wait for the
slowest rank's last episode, which is minutes on a healthy run (the scaling model's tail), so a
collective timeout long enough for that is far too long for a rank that died. And a collective
that times out says nothing about which rank or phase it waited for. Here:

- every rank publishes a heartbeat in the draw queue's store (the TCPStore rank 0 serves) every
  few seconds: a sequence number that moves while the process lives, the process's count of
  finished work (tbhpc/progress.py: generation requests, episodes, micro-batches) and its phase;
- the same thread reads its peers' heartbeats: one that stops moving for `dead_s` (the process is
  frozen, killed, or its node is gone) ends this rank at once, whatever phase it is in, with one
  line naming the peer and both phases; a store that stops answering means rank 0 is gone;
- after its rollouts a rank waits for the others at a meeting point in the store (`meet`), not
  in a collective: it waits while they make progress and gives up on one whose work count has not
  moved for `stall_s` (alive but hung);
- collectives (the update, the publication) still carry the process group's timeout, set to the
  same `collective_timeout_s`.

Ending a rank is the end of the job: `srun --kill-on-bad-exit` stops the other ranks and frees the
allocation, and the rank that gives up cancels the run's serving job (a crashed component must not
hold its GPUs). Times are compared on each rank's own clock (no cross-node clock skew).
"""
from __future__ import annotations

import os
import sys
import threading
import time
from contextlib import contextmanager

from tbhpc import progress
from tbhpc.errors import TbhpcError
from tbhpc.train.queue import store_lock


class RankLost(TbhpcError):
    """A peer rank died or hung: the run cannot go on (one line)."""


class Watch:
    def __init__(self, store, rank: int, world: int, dead_s: float, stall_s: float, field: str,
                 on_fatal=None, beat_s: float = 2.0):
        self.store, self.rank, self.world = store, rank, world
        self.dead_s, self.stall_s, self.field, self.beat_s = dead_s, stall_s, field, beat_s
        self.on_fatal = on_fatal or die
        self.phase = "starting"
        self._seq = 0
        self._lock = store_lock(store)
        self._seen: dict[int, tuple[str, float]] = {}      # peer -> (last heartbeat, when it last changed, my clock)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- the heartbeat thread -------------------------------------------------------------------
    def start(self) -> "Watch":
        if self.world > 1 and self._thread is None:
            self._beat()
            self._thread = threading.Thread(target=self._run, name="tbhpc-watch", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.beat_s):
            try:
                self._beat()
                lost = self.dead_peer()
            except Exception as exc:       # the store itself is gone: rank 0, which serves it, is
                lost = f"rank 0 (which serves the draw queue's store) stopped answering ({type(exc).__name__})"
            if lost and not self._stop.is_set():
                self.on_fatal(f"rank {self.rank}: {lost} while this rank was in {self.phase}; the run cannot go on "
                              f"(field {self.field!r} bounds how long a rank waits)")
                return

    def _beat(self) -> None:
        self._seq += 1
        with self._lock:
            self.store.set(f"watch/hb/{self.rank}", f"{self._seq} {progress.count()} {self.phase}")

    def _peer(self, r: int) -> str | None:
        with self._lock:
            key = f"watch/hb/{r}"
            return self.store.get(key).decode() if self.store.check([key]) else None

    def dead_peer(self) -> str:
        """'' while every peer's heartbeat moves; else which one stopped, for how long, in what phase."""
        now = time.monotonic()
        for r in range(self.world):
            if r == self.rank:
                continue
            beat = self._peer(r)
            old = self._seen.get(r)
            if old is None or beat != old[0]:
                self._seen[r] = (beat, now)
            elif now - old[1] > self.dead_s:
                phase = beat.split(" ", 2)[2] if beat and beat.count(" ") >= 2 else "starting"
                return f"rank {r} stopped answering {now - old[1]:.0f} s ago (it was in {phase})"
        return ""

    # ---- meeting points --------------------------------------------------------------------------
    def meet(self, point: str, phase: str, poll_s: float = 0.5) -> None:
        """Wait until every rank has reached `point`; raise RankLost naming a rank whose work count
        stayed still for `stall_s` before it got there (or whose heartbeat stopped)."""
        self.phase = f"waiting for the other ranks after {phase}"
        if self.world == 1:
            return
        with self._lock:
            self.store.set(f"watch/at/{point}/{self.rank}", "1")
        moved: dict[int, tuple[str, float]] = {}
        while True:
            with self._lock:
                missing = [r for r in range(self.world) if not self.store.check([f"watch/at/{point}/{r}"])]
            if not missing:
                return
            now = time.monotonic()
            for r in missing:
                beat = self._peer(r) or ""
                work = beat.split(" ")[1] if beat.count(" ") >= 1 else ""
                if r not in moved or moved[r][0] != work:
                    moved[r] = (work, now)
                elif now - moved[r][1] > self.stall_s:
                    raise RankLost(f"rank {self.rank}: rank {r} finished no work for {now - moved[r][1]:.0f} s during "
                                   f"{phase} while the other ranks waited for it; field {self.field!r} is "
                                   f"{self.stall_s:g} s (raise it if its episodes are that slow)")
            dead = self.dead_peer()
            if dead:
                raise RankLost(f"rank {self.rank}: {dead} during {phase}")
            time.sleep(poll_s)


@contextmanager
def collectives(watch: "Watch", phase: str, timeout_s: float, nccl: bool | None = None):
    """Run a phase of collectives; the process group's timeout (a peer alive but never arriving) comes
    out as one line naming the phase and the field instead of a backend's traceback. gloo raises on
    the host at the timeout; NCCL does not (the host waits in a later sync and NCCL's watchdog aborts
    the process, printing its own dump), so under NCCL a timer says the line, and ends the run through
    the watch (the serving job cancelled), just before the watchdog would. `nccl`: None asks torch."""
    watch.phase = phase
    timer = None
    if _nccl() if nccl is None else nccl:
        timer = threading.Timer(0.95 * timeout_s, lambda: watch.on_fatal(_timed_out(watch, phase, timeout_s)))
        timer.daemon = True
        timer.start()
    try:
        yield
    except RuntimeError as exc:
        text = str(exc).lower()
        if "timed out" not in text and "timeout" not in text:
            raise
        raise RankLost(_timed_out(watch, phase, timeout_s)) from None
    finally:
        if timer is not None:
            timer.cancel()


def _timed_out(watch: "Watch", phase: str, timeout_s: float) -> str:
    dead = watch.dead_peer()
    return (f"rank {watch.rank}: a collective of {phase} waited longer than field {watch.field!r} ({timeout_s:g} s) "
            "for the other ranks" + (f"; {dead}" if dead else "; every rank still answers: one is slower than that, raise it"))


def _nccl() -> bool:
    import torch.distributed as dist
    return dist.is_available() and dist.is_initialized() and dist.get_backend() == "nccl"


def die(line: str) -> None:
    """End this process now with one line (called from the watch thread: the main thread may be
    blocked inside a collective that would never return)."""
    sys.stderr.write(f"tbhpc: error: {line}\n")
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(2)
