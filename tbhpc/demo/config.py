"""What `make demo` runs: one dataclass (jobs/demo-pack.yaml, `key=value` overrides).

The defaults are the published recipe scaled to one 2-core machine: the demo model the project
built, probe n=8, the Jeffreys pool, GRPO with groups of 8 (fewer groups per step and a larger
learning rate than the 27B recipe: a 1M-parameter model on a CPU), and an evaluation of the start
and the trained checkpoint on the held-out split x 20. `baselines` puts the alternatives beside
GRPO for the same wall time from the same start: RFT (fine-tuning on the policy's own passed
episodes: the same checks, nothing more) and SFT on oracle demonstrations (which a user with only
checks does not have). `start` picks the start on the demo pack: `base`, a policy that sometimes
succeeds (the published experiment), or `plateau`, the same policy fine-tuned on demonstrations
until held-out pass@1 stopped rising (`make demo START=plateau`). `quick=true` is the pipeline
check: a noisy oracle instead of a model, no training.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tbhpc.config import load_config
from tbhpc.errors import UserError

MODELS = ("tiny", "smollm2")
STARTS = ("base", "plateau")
BASELINES = ("rft", "sft")      # rft: fine-tuning on its own passed episodes | sft: on oracle demonstrations


@dataclass
class DemoConfig:
    out: str = "runs/demo"                # where every stage's run directory goes
    model: str = "tiny"                 # tiny: the demo model built here | smollm2: SmolLM2-135M-Instruct
    start: str = "base"                 # tiny model, demo pack: base (models/demo-pack-warm) | plateau (models/demo-pack-plateau)
    warm_start: str = ""                # the start's directory; default: by `start` (tiny, demo pack; committed),
                                        # models/demo-warm (full) or build/models/smollm2-warm
    quick: bool = False                 # pipeline check with a noisy oracle (no model, no training)
    pack: str | None = "demo"           # demo: the demo pack (sized for the demo model) | full (or null): the full pack | a path
    seed: int = 0                       # seeds the training run and the campaigns
    limit: int | None = None            # first N tasks of each split (smoke runs)
    tasks: str | None = None            # probe only these train-split ids (a pool file or id list); default: the whole split
    sample: int | None = None           # an evenly spaced sample of N tasks of each split (every domain and template)
    probe_repeats: int = 8              # probe attempts per candidate (n)
    eval_repeats: int = 20              # eval attempts per held-out task
    workers: int = 2                    # campaign worker processes (one torch thread each)
    concurrency: int = 48               # episodes in flight per worker (one batched generator serves them)
    max_tokens: int = 160               # per generation
    response_budget: int = 640          # generated tokens per episode
    temperature: float = 1.0            # sampling temperature of probe, training rollouts and eval alike
    prices: str = "jobs/prices.yaml"    # USD per 1M tokens per role: cost per success / per reliable task
    train: dict[str, Any] = field(default_factory=dict)   # TrainConfig overrides (steps, groups_per_step, lr, ...)
    baselines: list[str] = field(default_factory=list)   # beside GRPO, same start and wall time: rft, sft (evaluated too)
    candidates_seed: int | None = None  # probe, select and train on train instances drawn with this seed, none of them an
                                        # instance of the bundled pack, whose train split the SFT plateau learnt from
    candidates_per_template: int = 80   # candidate instances of each template (11 templates)
    fresh_seed: int | None = None       # after training, generate demo-pack instances with this seed and evaluate on them too
    fresh_repeats: int = 10             # eval attempts per fresh instance
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
        if self.start not in STARTS:
            raise UserError(f"demo config: field 'start' must be one of {', '.join(STARTS)}, got {self.start!r}")
        if self.start != "base" and (self.model != "tiny" or self.pack != "demo"):
            raise UserError("demo config: field 'start' other than base needs model: tiny and pack: demo")
        bad = [b for b in self.baselines if b not in BASELINES]
        if bad or len(set(self.baselines)) != len(self.baselines):
            raise UserError(f"demo config: field 'baselines' takes each of {', '.join(BASELINES)} at most once, "
                            f"got {self.baselines!r}")
        if self.fresh_seed is not None and self.pack != "demo":
            raise UserError("demo config: field 'fresh_seed' needs pack: demo (fresh instances come from its generator)")

    @property
    def warm_path(self) -> str:
        if self.warm_start:
            return self.warm_start
        if self.model == "tiny":
            return f"models/demo-pack-{'warm' if self.start == 'base' else 'plateau'}" if self.pack == "demo" else "models/demo-warm"
        return "build/models/smollm2-warm" + ("-demo-pack" if self.pack == "demo" else "")


def load_demo_config(path: Path | str | None, overrides: list[str] | tuple = ()) -> DemoConfig:
    """The one way the demo's config is read (`tbhpc demo`, `make demo`): the YAML file < `key=value`."""
    return load_config(DemoConfig, path, list(overrides))
