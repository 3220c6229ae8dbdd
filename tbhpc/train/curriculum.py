"""A pool that does not run dry: when too few of the groups a run draws are informative, the pool
is re-banded with what the policy just did and refilled with candidates it has not tried.

Why: the pool is selected once, for the base policy; as training sharpens it, tasks leave the
middle bands and their groups come back all-pass (or all-fail), which GRPO cannot learn from: the
mixed-group share falls towards 0 and steps end without an update (docs/demo.md, "Measured: 300
steps from the plateau"). prime-rl keeps difficulty pools for this reason.

How, with nothing but the trainer's own groups as evidence (a group of G is a probe of n = G):
- every decided group (mixed or flat; a dropped group is a system error, never evidence) is kept
  as (passes, episodes) in its task's record of its last `memory` groups (older ones came from an
  older policy);
- when the mixed share over the last `window` steps falls below `below`, the pool is refreshed:
  each task with at least `min_n` episodes in its record is re-banded with the probe's Jeffreys
  bands (selection/bands.py) and leaves the pool when it lands outside hard/medium/easy; the same
  number of candidates (or `size`) joins, taken in a seeded order from the candidate list; past
  the end of the list a new order begins, so a candidate retired earlier is probed again by a
  newer policy. Why plain order, solved candidates included, not the unsolved ones first: near a
  plateau, unsolved-first fills the pool with the few hard tasks left, validation falls and the
  entropy guard stops the run (docs/demo.md, "Measured: 300 steps from the plateau"); in plain
  order the pool stays mostly solvable and the policy keeps what it knows.
  Why two groups of evidence by default, not the probe's one: a task with p = 0.9 passes 8 of 8
  in 43% of its groups, and one that leaves for that is usually replaced by a candidate that is
  easier still (a policy near its plateau solves most candidates);
- a refresh decided after step s applies from step s + 1 + max_staleness (the rollouts of the
  steps in between were drawn already), and the whole state is in the checkpoint, so a resumed
  run draws exactly what an uninterrupted one drew: draws are a pure function of (seed, step,
  the pool in force at that step).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tbhpc.selection.bands import BAND_NAMES, DEFAULT_KEEP, assign
from tbhpc.train.draw import seeded_rng


@dataclass
class Curriculum:
    pool: list[str]                     # the selected pool: in force from step 1
    candidates: list[str]               # where new tasks come from (may be empty: re-band only)
    seed: int
    below: float                        # refresh when the mixed share over `window` steps is below this
    window: int
    min_n: int                          # episodes of evidence a task needs to be re-banded (the trainer: two groups)
    size: int = 0                       # candidates admitted per refresh (0: as many as retired)
    lag: int = 0                        # max_staleness: steps already drawn when a refresh is decided
    version: int = 0
    pools: list[tuple[int, int, list[str]]] = field(default_factory=list)   # (first step, version, pool), in order
    tallies: dict[str, list[list[int]]] = field(default_factory=dict)  # task -> its last groups' [passes, episodes]
    memory: int = 4                     # groups kept per task
    shares: list[list[int]] = field(default_factory=list)              # [mixed, decided] of recent steps
    cycle: int = 0
    cursor: int = 0

    def __post_init__(self) -> None:
        if not self.pools:
            self.pools = [(1, 0, list(self.pool))]

    # ---- draws -------------------------------------------------------------------------------
    def _at(self, step: int) -> tuple[int, int, list[str]]:
        current = self.pools[0]
        for entry in self.pools:
            if entry[0] <= step:
                current = entry
        return current

    def pool_at(self, step: int) -> list[str]:
        """The pool the draws of `step` use."""
        return self._at(step)[2]

    def version_at(self, step: int) -> int:
        return self._at(step)[1]

    @property
    def current(self) -> list[str]:
        return self.pools[-1][2]

    # ---- evidence and refresh ----------------------------------------------------------------
    def observe(self, step: int, groups: list[tuple[str, int, int]], mixed: int, decided: int) -> dict | None:
        """Step `step`'s decided groups as (task, passes, episodes) and its mixed/decided counts (all
        ranks'); returns the refresh record when this step triggers one, else None."""
        for task, k, n in groups:
            self.tallies[task] = (self.tallies.get(task, []) + [[int(k), int(n)]])[-self.memory:]
        self.shares = (self.shares + [[int(mixed), int(decided)]])[-self.window:]
        if self.below <= 0 or len(self.shares) < self.window:
            return None
        share = sum(m for m, _ in self.shares) / max(sum(d for _, d in self.shares), 1)
        return self.refresh(step, share) if share < self.below else None

    def refresh(self, step: int, share: float) -> dict:
        pool = self.current
        evidence = {t: np.sum(self.tallies[t], axis=0) for t in pool if t in self.tallies}
        judged = [t for t in pool if t in evidence and evidence[t][1] >= self.min_n]
        retired: list[str] = []
        if judged:
            k = np.array([evidence[t][0] for t in judged])
            n = np.array([evidence[t][1] for t in judged])
            bands = assign(k, n)[0]
            retired = [t for t, b in zip(judged, bands) if BAND_NAMES[int(b)] not in DEFAULT_KEEP]
        gone = set(retired)
        kept = [t for t in pool if t not in gone]
        admitted = self._next_candidates(self.size or len(retired), set(kept) | gone)
        new = kept + admitted
        note = ""
        if not new:                       # nothing left and nothing to add: keep training on what there is
            new, note = list(pool), "every task left its band and no candidate is left; the pool is kept"
        self.version += 1
        self.pools.append((step + 1 + self.lag, self.version, new))
        self.pools = self.pools[-(self.lag + 2):]        # the pools still to be drawn from, and the one before
        staying = set(new)
        self.tallies = {t: v for t, v in self.tallies.items() if t in staying}   # what stays keeps its record
        self.shares = []
        return {"step": step, "from_step": step + 1 + self.lag, "version": self.version, "mixed_share": round(share, 4),
                "retired": retired, "admitted": admitted, "pool": len(new), **({"note": note} if note else {})}

    def _next_candidates(self, want: int, skip: set[str]) -> list[str]:
        """Up to `want` candidates not in `skip`, in the seeded order of the current cycle; one more
        cycle at most per call (its order seeded by the cycle number), so none repeats within a call."""
        out: list[str] = []
        if not self.candidates or want <= 0:
            return out
        seen = 0
        while len(out) < want and seen < 2 * len(self.candidates):
            if self.cursor >= len(self.candidates):
                self.cycle, self.cursor = self.cycle + 1, 0
            order = seeded_rng(self.seed, 4099, self.cycle).permutation(len(self.candidates))
            task = self.candidates[int(order[self.cursor])]
            self.cursor += 1
            seen += 1
            if task not in skip and task not in out:
                out.append(task)
        return out

    # ---- checkpoint --------------------------------------------------------------------------
    def state(self) -> dict:
        return {"version": self.version, "pools": [[first, v, list(p)] for first, v, p in self.pools],
                "tallies": {t: [list(g) for g in v] for t, v in self.tallies.items()}, "shares": [list(s) for s in self.shares],
                "cycle": self.cycle, "cursor": self.cursor}

    def restore(self, state: dict | None) -> None:
        if not state:
            return
        self.version, self.cycle, self.cursor = int(state["version"]), int(state["cycle"]), int(state["cursor"])
        self.pools = [(int(first), int(v), list(p)) for first, v, p in state["pools"]]
        self.tallies = {t: [[int(a), int(b)] for a, b in v] for t, v in state["tallies"].items()}
        self.shares = [[int(a), int(b)] for a, b in state["shares"]]


def evidence(groups, world: int) -> tuple[list[tuple[str, int, int]], int, int]:
    """A step's decided groups on every rank as (task, passes, episodes), in draw order, and the
    counts of mixed and decided groups (what `observe` takes). Collective when world > 1."""
    from tbhpc.train.queue import MIXED
    from tbhpc.train.rft import passed
    mine = [(g.index, g.task_id, sum(passed(r.episode.reward) for r in g.rollouts), len(g.rollouts), g.status == MIXED)
            for g in groups]
    if world > 1:
        import torch.distributed as dist
        parts: list = [None] * world
        dist.all_gather_object(parts, mine)
        mine = [x for part in parts for x in part]
    mine.sort()
    return [(t, k, n) for _, t, k, n, _ in mine], sum(m for *_, m in mine), len(mine)


def record_refresh(run_path: Path, rec: dict) -> str:
    """Append a refresh to RUN/logs/curriculum.jsonl; returns the line for the log."""
    logs = Path(run_path) / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / "curriculum.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(rec) + "\n")
    return (f"train: curriculum: mixed share {rec['mixed_share']:.2f} over the last steps at step {rec['step']}; "
            f"{len(rec['retired'])} task(s) left their band, {len(rec['admitted'])} candidate(s) joined: pool version "
            f"{rec['version']} ({rec['pool']} tasks) from step {rec['from_step']}" + (f" ({rec['note']})" if rec.get("note") else ""))
