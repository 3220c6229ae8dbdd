"""A process-wide count of finished units of work (a generation request, an episode, a micro-batch).

Why a bare counter at the bottom of the package: the trainer's watch (tbhpc/train/watch.py) tells a
rank that is slow from one that is hung by whether this count still moves, and the places that do
the work (policies, rollouts, the engine) sit below the trainer, so they can only reach down to it.
"""
from __future__ import annotations

import itertools

_counter = itertools.count(1)
_last = 0


def mark() -> None:
    """One more unit of work finished (thread-safe: itertools.count's next is atomic under the GIL)."""
    global _last
    _last = next(_counter)


def count() -> int:
    return _last
