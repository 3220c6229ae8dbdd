"""Decided groups of steps not trained yet, kept on disk so that a preemption does not lose them.

Why: off-policy, up to k steps' rollouts are open when a signal stops the run, and their draw
queues live in rank 0's key-value store, which dies with it. A group whose outcome is decided
(mixed, flat or dropped) is written here by the rank that ran it, before it is reported; the
resumed run's rank that claims the same draw takes the group back instead of running it, so its
token-exact rows are the ones sampled before the stop. Draws still in flight are redrawn: the task
and the seeds of a draw are a pure function of (seed, step, index) (train/draw.py).

Layout: RUN/rollouts/pending/step-NNNNNN/draw-NNNNN.pkl, one pickled `GroupOutcome` per file,
written to a temp file and renamed (whole or absent). Pickle, because a group holds transcripts,
grades and token arrays the run itself wrote and reads back with the same code; these files are
not an exchange format, and the directory is the run's own, like its DeepSpeed checkpoints.
"""
from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path


class PendingGroups:
    def __init__(self, run_path: Path):
        self.root = Path(run_path) / "rollouts" / "pending"

    def _dir(self, step: int) -> Path:
        return self.root / f"step-{step:06d}"

    def save(self, step: int, group) -> None:
        d = self._dir(step)
        d.mkdir(parents=True, exist_ok=True)
        final = d / f"draw-{group.index:05d}.pkl"
        tmp = d / f".tmp-{final.name}.{os.getpid()}"
        with open(tmp, "wb") as f:
            pickle.dump(group, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, final)

    def load(self, step: int, index: int):
        """The decided group of draw `index` of step `step`, or None."""
        path = self._dir(step) / f"draw-{index:05d}.pkl"
        try:
            with open(path, "rb") as f:
                return pickle.load(f)
        except FileNotFoundError:
            return None

    def done(self, step: int) -> None:
        """Step `step` is trained and recorded: its groups are no longer pending."""
        shutil.rmtree(self._dir(step), ignore_errors=True)

    def resume(self, trained: int) -> int:
        """A run resumes after step `trained`: groups of trained steps go, and so does any group a
        version newer than `trained` sampled (those weights were discarded: the resumed run
        publishes its own). Returns how many decided groups stay to be taken back."""
        kept = 0
        for d in sorted(self.root.glob("step-*")) if self.root.exists() else []:
            if int(d.name[5:]) <= trained:
                shutil.rmtree(d, ignore_errors=True)
                continue
            for f in sorted(d.glob("draw-*.pkl")):
                try:
                    with open(f, "rb") as fh:
                        group = pickle.load(fh)
                except Exception:       # cut short by the stop: drawn again
                    f.unlink(missing_ok=True)
                    continue
                if newest_version(group) > trained:
                    f.unlink(missing_ok=True)
                else:
                    kept += 1
        return kept


def newest_version(group) -> int:
    """The newest weight version that sampled any token of the group (-1: none)."""
    return max((s.newest_version for r in group.rollouts for s in r.samples), default=-1)
