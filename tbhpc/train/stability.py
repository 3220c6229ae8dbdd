"""What keeps a long GRPO run from collapsing: overlong shaping and filtering, a variance floor on
groups, and a guard that watches response length and entropy. Pure functions and one small state
object, so each rule is tested alone; the loop (loop.py) only calls them.

Why: under a token-mean loss a long failing episode weighs by its length. Once a few episodes
ramble to the response budget, pushing their many tokens down flattens the policy and more of them
ramble, so a run that was steady can collapse within a few steps (the demo's collapse:
docs/measurements/demo-history.md, "The demo pack"). The peers' tools for this, each a TrainConfig
field, off by default:

- overlong filtering (DAPO): an episode cut off by the response budget keeps its place in the
  group's baseline but none of its tokens are trained on (`overlong_filter`);
- soft overlong punishment (DAPO): the reward used for advantages falls linearly from 0 to
  -`overlong_penalty` over the last `overlong_buffer` tokens of the budget. The *graded* reward in
  the results stays the binary check; only the advantage sees the shaping;
- a variance floor (`min_group_std`): a group whose rewards' std is below it counts as flat and is
  replaced, as a zero-variance group is (grpo.is_informative; with G = 8 binary rewards, 0.35 drops
  1-of-8 and 7-of-8);
- the collapse guard (`guard_length`, `guard_entropy`): the reference is the median of the first
  `guard_window` steps' mean generated tokens per episode and entropy (a Monte Carlo estimate: the
  mean surprisal of the sampled tokens under the sampling policy). When a later step's rollouts
  exceed either by its factor, the weights that sampled them are judged bad: `rollback` restores
  the DeepSpeed state of the newest step whose weights passed and scales the learning rate by
  `guard_lr_factor`; `stop` restores it, exports it and ends the run (after `guard_max_rollbacks`
  rollbacks a trip stops). Only a *rise* of entropy is a runaway: GRPO sharpens, so the entropy of
  a healthy run falls while length and reward hold, and a two-sided band would stop it for nothing
  (docs/guides/training.md).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import numpy as np

BUDGET_FINISH = "response_budget"     # env.episode's finish reason for an episode cut off by the budget


def overlong_penalty(generated: int, budget: int, buffer: int, penalty: float = 1.0) -> float:
    """DAPO's soft overlong punishment: 0 up to budget - buffer, then linear down to -penalty at
    the budget (and beyond). `buffer` 0: off."""
    if buffer <= 0 or generated <= budget - buffer:
        return 0.0
    return -penalty * min(1.0, (generated - (budget - buffer)) / buffer)


def generated_tokens(rollout) -> int:
    """Tokens the policy generated in one episode (every sample's loss tokens)."""
    return int(sum(int(np.sum(s.loss_mask)) for s in rollout.samples))


def shaped_rewards(rollouts, budget: int, buffer: int, penalty: float) -> list[float]:
    """The rewards the advantages are computed from: the grade plus the overlong penalty."""
    return [float(r.episode.reward) + overlong_penalty(generated_tokens(r), budget, buffer, penalty) for r in rollouts]


def is_overlong(sample) -> bool:
    return sample.finish_reason == BUDGET_FINISH


@dataclass
class RolloutHealth:
    """A step's rollouts as the guard sees them (summed over ranks by the caller)."""
    episodes: int = 0
    generated: int = 0          # generated tokens over all episodes
    surprisal: float = 0.0      # sum of -behaviour logprob over generated tokens
    overlong: int = 0           # episodes cut off by the response budget

    @property
    def length(self) -> float:
        return self.generated / self.episodes if self.episodes else 0.0

    @property
    def entropy(self) -> float:
        return self.surprisal / self.generated if self.generated else 0.0

    def as_list(self) -> list[float]:
        return [self.episodes, self.generated, self.surprisal, self.overlong]

    @classmethod
    def from_list(cls, v: list[float]) -> "RolloutHealth":
        return cls(int(v[0]), int(v[1]), float(v[2]), int(v[3]))

    @classmethod
    def of(cls, rollouts) -> "RolloutHealth":
        h = cls()
        for r in rollouts:
            h.episodes += 1
            h.overlong += int(is_overlong(r.episode))
            for s in r.samples:
                m = np.asarray(s.loss_mask, dtype=bool)
                h.generated += int(m.sum())
                h.surprisal += float(-np.asarray(s.logprobs, dtype=np.float64)[m].sum())
        return h


@dataclass
class CollapseGuard:
    """The guard's state: the reference steps and the rollbacks so far (saved in the DeepSpeed
    checkpoint's client state, so a resumed run judges with the same reference)."""
    length_factor: float = 0.0     # trip when mean generated tokens > factor x reference (0: not watched)
    entropy_factor: float = 0.0    # trip when entropy > factor x reference (0: not watched)
    window: int = 5
    fixed: list[float] | None = None   # a given [length, entropy] reference instead of the window's medians
    reference_steps: list[list[float]] = field(default_factory=list)   # [length, entropy] of the first `window` steps
    rollbacks: int = 0
    good: int = 0                  # the newest step whose weights sampled rollouts that passed (the way back)

    @property
    def active(self) -> bool:
        return bool(self.length_factor or self.entropy_factor)

    def reference(self) -> tuple[float, float] | None:
        """None while the first `window` steps run (never judged: with no fixed reference they make
        it, and either way a trip needs a checkpoint of a step that passed to return to)."""
        if len(self.reference_steps) < self.window:
            return None
        if self.fixed:
            return float(self.fixed[0]), float(self.fixed[1])
        return (statistics.median(r[0] for r in self.reference_steps),
                statistics.median(r[1] for r in self.reference_steps))

    def check(self, health: RolloutHealth) -> str:
        """'' when the step's rollouts look like the reference's (or the reference is still being
        collected: the step then joins it), else the reason the guard trips."""
        ref = self.reference()
        if ref is None:
            self.reference_steps.append([health.length, health.entropy])
            return ""
        length, entropy = ref
        if self.length_factor and health.length > self.length_factor * length:
            return (f"mean response {health.length:.0f} tokens > {self.length_factor:g} x the reference "
                    f"{length:.0f}")
        if self.entropy_factor and health.entropy > self.entropy_factor * entropy:
            return f"entropy {health.entropy:.4f} > {self.entropy_factor:g} x the reference {entropy:.4f}"
        return ""

    def state(self) -> dict:
        return {"reference_steps": self.reference_steps, "rollbacks": self.rollbacks, "good": self.good}

    def restore(self, state: dict | None) -> None:
        if state:
            self.reference_steps = [list(r) for r in state.get("reference_steps", [])]
            self.rollbacks = int(state.get("rollbacks", 0))
            self.good = int(state.get("good", 0))
