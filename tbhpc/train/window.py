"""The rollouts of up to k steps at once beside the update (`max_staleness: k`), each admitted by
the weights it may sample from.

The bound. Step t updates the weights of version t-1; a token that version v sampled is
(t-1) - v versions stale when step t trains on it. Step t claims draws only once a version
>= t-1-k is served (`admission_version`), and a server's version only moves forward, so every
token of step t, whichever turn sampled it and however many syncs the episode spans, is at most
k behind. Admission, not dropping: no finished episode is thrown away for its age.

The window. While step s updates, the rollouts of steps s+1 .. s+k run (k = 1: one step, the
one-step-off-policy loop; k = 0: none, on-policy). The longest episode of a step then delays only
its own step: k steps share the time the slowest episode takes, and the other steps' draws keep
the server busy meanwhile.

In-process generators (generator=local | batched) hold one set of weights, so their steps take
turns (`serial`): step t starts once step t-1's rollouts end and samples from exactly version
t-1-k, which is what makes a resumed run redraw the same rows.
"""
from __future__ import annotations

import threading


def admission_version(step: int, max_staleness: int) -> int:
    """The oldest version step `step` may sample from (the base model, 0, for the first steps)."""
    return max(0, step - 1 - max_staleness)


def staleness(step: int, version: int) -> int:
    """How many versions behind the weights step `step` updates a token of `version` is."""
    return step - 1 - version


class Ahead:
    """One step's rollouts, running in a thread while earlier steps update; its result, or its
    exception, is handed to the loop's thread. `after`: a step whose rollouts must end first
    (in-process generation: one set of weights)."""

    def __init__(self, fn, step: int, after: "Ahead | None" = None):
        self.value, self.error, self.after = None, None, after
        self.thread = threading.Thread(target=self._run, args=(fn, step), name=f"rollouts-{step}", daemon=True)

    @classmethod
    def started(cls, fn, step: int, after: "Ahead | None" = None) -> "Ahead":
        a = cls(fn, step, after)
        a.thread.start()
        return a

    def _run(self, fn, step: int) -> None:
        try:
            if self.after is not None:
                self.after.thread.join()       # its error, if any, is raised when its step is taken
            self.value = fn(step)
        except BaseException as exc:    # handed to the loop, which raises it in the main thread
            self.error = exc
        self.after = None               # no chain of finished steps kept alive

    def join(self) -> None:
        self.thread.join()

    def result(self):
        self.thread.join()
        if self.error is not None:
            raise self.error
        return self.value


class Window:
    """The open steps' rollouts. `fill(upto)` opens every step up to `upto` (and `last`) not yet
    open; `take(step)` returns a step's rollouts (run in the caller's thread when it was not
    opened: on-policy); `close()` waits for every open step (the caller has set the stop event)."""

    def __init__(self, fn, last: int, serial: bool):
        self.fn, self.last, self.serial = fn, last, serial
        self.open: dict[int, Ahead] = {}
        self.opened = 0                 # the newest step ever opened

    def fill(self, upto: int) -> None:
        for step in range(self.opened + 1, min(upto, self.last) + 1):
            after = self.open.get(step - 1) if self.serial else None
            self.open[step] = Ahead.started(self.fn, step, after)
            self.opened = step

    def start_at(self, step: int) -> None:
        """The first step this process runs (a resumed run starts past 1)."""
        self.opened = max(self.opened, step - 1)

    def take(self, step: int):
        ahead = self.open.pop(step, None)
        if ahead is None:
            self.opened = max(self.opened, step)
            return self.fn(step)
        return ahead.result()

    def running(self) -> list[int]:
        return sorted(self.open)

    def close(self) -> None:
        for ahead in list(self.open.values()):
            ahead.join()
        self.open.clear()
