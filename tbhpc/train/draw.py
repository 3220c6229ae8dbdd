"""Which tasks a step trains on: the pool, guarded against held-out ids, drawn in an order that is
a pure function of (seed, step).

Why pure: a requeued trainer must redraw exactly what it would have drawn, and every rank must
agree on draw i without talking. Draw i of a step is the i-th task of a permutation of the pool
seeded by (seed, step, cycle); past the pool's end the next cycle is another permutation, so a
small pool is reused rather than exhausted. The seeds of draw i's episodes derive from the same
triple, so a draw is the same group of episodes wherever and whenever it runs.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from tbhpc.tasks.loader import read_id_list as read_task_ids
from tbhpc.errors import UserError


def load_pool(pool_file: str | Path, exclude_files: list[str] | None = None) -> list[str]:
    """Task ids of a pool file; refuses a pool that contains any id of an exclusion list."""
    ids = list(dict.fromkeys(read_task_ids(Path(pool_file))))
    if not ids:
        raise UserError(f"{pool_file}: the pool is empty (nothing to train on)")
    for f in exclude_files or []:
        banned = set(read_task_ids(Path(f)))
        leaked = [i for i in ids if i in banned]
        if leaked:
            named = ", ".join(repr(i) for i in leaked[:5]) + (f" and {len(leaked) - 5} more" if len(leaked) > 5 else "")
            raise UserError(f"{pool_file}: {len(leaked)} task(s) of the exclusion list {f} are in the pool "
                            f"({named}); training on benchmark or held-out tasks is refused")
    return ids


def seeded_rng(*parts: int) -> np.random.Generator:
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "big"))


def draw(pool: list[str], seed: int, step: int, index: int) -> str:
    """The task of draw `index` in step `step`."""
    cycle, pos = divmod(index, len(pool))
    order = seeded_rng(seed, step, cycle).permutation(len(pool))
    return pool[int(order[pos])]


def episode_seed(seed: int, step: int, index: int) -> int:
    """Base seed of draw `index`'s episodes (attempt i uses base + i)."""
    return int(seeded_rng(seed, step, index, 7).integers(0, 2**31 - 2**16))
