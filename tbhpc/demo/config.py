"""What `make demo` runs: one dataclass (jobs/demo.yaml, `key=value` overrides).

The defaults (jobs/demo.yaml) are the published recipe scaled to one 2-core machine: the demo
model the project built (the committed warm start models/demo-warm; `make warmstart-demo` regenerates it), probe
n=8 on the train split, the Jeffreys pool, GRPO with groups of 8 (fewer groups per step and a
larger learning rate than the 27B recipe: a 1M-parameter model on a CPU), and an evaluation of
the warm start and the trained checkpoint on the held-out split x 20. `quick=true` keeps the old
pipeline check: a noisy oracle instead of a model, no training. jobs/demo-smollm2.yaml scales
the same pipeline down to what SmolLM2-135M costs here (`make demo MODEL=smollm2`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tbhpc.errors import UserError

MODELS = ("tiny", "smollm2")


@dataclass
class DemoConfig:
    out: str = "runs/demo"
    model: str = "tiny"                 # tiny: the demo model built here | smollm2: SmolLM2-135M-Instruct
    warm_start: str = ""                # default: models/demo-pack-plateau (tiny, demo pack; committed), models/demo-warm (full) or build/models/smollm2-warm
    quick: bool = False                 # pipeline check with a noisy oracle (no model, no training)
    pack: str | None = "demo"           # demo: the demo pack (sized for the demo model) | full (or null): the full pack | a path
    seed: int = 0
    limit: int | None = None            # first N tasks of each split (smoke runs)
    tasks: str | None = None            # probe only these train-split ids (a pool file or id list); default: the whole split
    sample: int | None = None           # an evenly spaced sample of N tasks of each split (every domain and template)
    probe_repeats: int = 8
    eval_repeats: int = 20
    workers: int = 2                    # campaign worker processes (one torch thread each)
    concurrency: int = 48               # episodes in flight per worker (one batched generator serves them)
    max_tokens: int = 160               # per generation
    response_budget: int = 640          # generated tokens per episode
    temperature: float = 1.0            # sampling temperature of probe, training rollouts and eval alike
    prices: str = "jobs/prices.yaml"    # USD per 1M tokens per role: cost per success / per reliable task
    train: dict[str, Any] = field(default_factory=dict)   # TrainConfig overrides (steps, groups_per_step, lr, ...)
    sft_baseline: bool = False          # also continue the warm start's SFT for GRPO's wall time, and evaluate it
    candidates_seed: int | None = None  # probe, select and train on train instances drawn with this seed, none of them an
                                        # instance of the bundled pack, whose train split the SFT plateau learnt from
    candidates_per_template: int = 80   # candidate instances of each template (11 templates)
    fresh_seed: int | None = None       # after training, generate demo-pack instances with this seed and evaluate on them too
    fresh_repeats: int = 10
    fresh_per_template: int = 10        # fresh instances of each template (11 templates: 110 tasks at 10)
    skill: float = 0.7                  # quick mode: the noisy oracle keeps each golden step with this probability

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise UserError(f"demo config: field 'model' must be one of {', '.join(MODELS)}, got {self.model!r}")
        if self.limit is not None and self.limit < 1:
            raise UserError(f"demo config: field 'limit' must be >= 1 (or null: every task), got {self.limit!r}")
        if not 0.0 <= self.skill <= 1.0:
            raise UserError(f"demo config: field 'skill' must be within [0, 1], got {self.skill}")
        if self.sample is not None and (self.sample < 1 or self.tasks):
            raise UserError("demo config: field 'sample' must be >= 1 and cannot be combined with 'tasks'")
        for name in ("probe_repeats", "eval_repeats", "workers", "concurrency", "max_tokens", "response_budget", "fresh_repeats",
                     "fresh_per_template"):
            if getattr(self, name) < 1:
                raise UserError(f"demo config: field {name!r} must be >= 1")
        if not str(self.out).strip():
            raise UserError("demo config: field 'out' is empty (it would mean the current directory); name a folder")
        if not 0.0 < self.temperature <= 2.0:
            raise UserError(f"demo config: field 'temperature' must be within (0, 2], got {self.temperature}")

        if self.candidates_seed is not None and (self.pack != "demo" or self.tasks):
            raise UserError("demo config: field 'candidates_seed' needs pack: demo and no 'tasks' (candidates come from "
                            "its generator)")
        if self.candidates_per_template < 1:
            raise UserError("demo config: field 'candidates_per_template' must be >= 1")
        if self.fresh_seed is not None and self.pack != "demo":
            raise UserError("demo config: field 'fresh_seed' needs pack: demo (fresh instances come from its generator)")

    @property
    def warm_path(self) -> str:
        if self.warm_start:
            return self.warm_start
        if self.model == "tiny":
            return "models/demo-pack-plateau" if self.pack == "demo" else "models/demo-warm"
        return "build/models/smollm2-warm" + ("-demo-pack" if self.pack == "demo" else "")
