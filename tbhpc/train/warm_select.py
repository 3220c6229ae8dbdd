"""Choose where a warm start stops by held-out evaluation, not by a step count.

Why: GRPO sharpens a policy that is right about half the time; a warm start that is always right
or never right gives groups without variance, hence no gradient. How fast SFT gets there depends
on the seed, the data and the machine, so `tbhpc warmstart --select` evaluates a checkpoint every
`every` steps on validation tasks (fresh instances that neither the train split nor the eval
split holds: the demo pack's generator with another seed) with the campaign code and sampling the
recipe uses (temperature 1). A phase gated "first" stops at the first checkpoint whose pass@1 is
inside the target band with no task type at 0% or 100% (that checkpoint is chosen). A phase gated
"best" (the low-lr polish after it) runs on and keeps the best checkpoint inside the band; it ends
after `patience` evaluations without a better one. A phase gated "plateau" (the SFT plateau GRPO
starts from) keeps the best checkpoint by pass@1 alone, band or not, and ends once `patience`
evaluations in a row have not beaten it by more than `min_delta`: where more SFT stops paying.
Why polish: a checkpoint taken mid-schedule at a
high lr is noisy (its failures are copying slips that more demonstrations cure at once, so
continued SFT would beat any RL started there); polished, its remaining failures are decisions.
Every checkpoint's figures go to `selection.json` beside the model, so the choice can be read
afterwards.
"""
from __future__ import annotations

import copy
import json
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

VALIDATION_SEED = 1001


@dataclass
class SelectGate:
    pack: str                      # validation pack directory (its eval split is used)
    every: int = 150
    lo: float = 0.5
    hi: float = 0.85
    repeats: int = 4
    workers: int = 2
    patience: int = 3              # "best"/"plateau" phases: evaluations without a better checkpoint before the phase ends
    min_delta: float = 0.0         # "plateau": a checkpoint must beat the best by more than this to count as better
    log: object = print
    history: list[dict] = field(default_factory=list)
    chosen: dict | None = None
    _state: dict | None = None     # the chosen checkpoint's weights (restored before saving)
    _stale: int = 0
    _mode: str = "first"
    _t0: float = field(default_factory=time.perf_counter)

    def __call__(self, step: int, model, tokenizer, mode: str = "first") -> bool:
        """Evaluate the model as it is after `step` steps; True: end the current phase here."""
        if mode != self._mode:
            self._stale, self._mode = 0, mode
        work = Path(tempfile.mkdtemp(prefix="warm-select-"))
        try:
            model.save_pretrained(work / "model")
            tokenizer.save_pretrained(work / "model")
            rates = evaluate(str(work / "model"), self.pack, work / "eval", self.repeats, self.workers)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        row = {"step": step, "phase_gate": mode, "seconds": round(time.perf_counter() - self._t0, 1), **rates}
        self.history.append(row)
        types = rates["per_type"].values()
        inside = in_band(rates, self.lo, self.hi)
        if mode == "plateau":
            better = self.chosen is None or rates["pass_at_1"] > self.chosen["pass_at_1"] + self.min_delta
        else:
            better = inside and (mode == "first" or self.chosen is None or rates["pass_at_1"] > self.chosen["pass_at_1"])
        self.log(f"warm-select: step {step}: held-out pass@1 {rates['pass_at_1']:.3f} "
                 f"(types {min(types):.2f}-{max(types):.2f}){' -> chosen' if better else ''}")
        if better:
            self.chosen, self._stale = row, 0
            self._state = copy.deepcopy(model.state_dict())
        else:
            self._stale += 1
        return inside if mode == "first" else self._stale >= self.patience

    def restore(self, model) -> None:
        """Put the chosen checkpoint's weights back into `model` (no-op when none was chosen)."""
        if self._state is not None:
            model.load_state_dict(self._state)

    def write(self, out: Path) -> None:
        gate = {k: v for k, v in asdict(self).items() if k not in ("log", "history", "chosen", "pack", "_state", "_stale", "_mode", "_t0")}
        doc = {"gate": {"validation": f"demo pack, seed {VALIDATION_SEED}, eval split", **gate},
               "chosen": self.chosen, "history": self.history}
        (Path(out) / "selection.json").write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")


def in_band(rates: dict, lo: float, hi: float) -> bool:
    """Overall pass@1 within [lo, hi] and every task type strictly between 0 and 1."""
    return lo <= rates["pass_at_1"] <= hi and bool(rates["per_type"]) and all(0.0 < r < 1.0 for r in rates["per_type"].values())


def evaluate(model_path: str, pack: str, out: Path, repeats: int, workers: int) -> dict:
    """pass@1 overall and per task type (domain/template) of `model_path` on the pack's eval split."""
    from rich.console import Console

    from tbhpc.campaign.config import CampaignConfig
    from tbhpc.campaign.runner import run_campaign
    cfg = CampaignConfig(name="warm-select", kind="eval", pack=pack, split="eval", repeats=repeats, policy="tokens",
                         policy_opts={"model_path": model_path, "generator": "batched", "max_tokens": 64,
                                      "response_budget": 256, "temperature": 1.0, "threads": 1},
                         workers=workers, concurrency=48, chunk_size=96, transcripts=False)
    run_campaign(cfg, out, console=Console(stderr=True, quiet=True))
    from tbhpc.store.health import open_results
    con = open_results(out / "results.duckdb", read_only=True)
    try:
        overall = con.sql("SELECT avg(reward) FROM attempts WHERE status = 'ok'").fetchone()[0]
        per = con.sql("SELECT t.domain || '/' || t.template, avg(a.reward) FROM attempts a JOIN tasks t USING (task_id) "
                      "WHERE a.status = 'ok' GROUP BY 1 ORDER BY 1").fetchall()
    finally:
        con.close()
    return {"pass_at_1": float(overall), "per_type": {k: float(v) for k, v in per}}


def validation_pack(out: Path) -> str:
    """Fresh demo-pack instances for checkpoint selection (eval split of another seed)."""
    from tbhpc.domains.demo.pack import write_demo_pack
    write_demo_pack(Path(out), seed=VALIDATION_SEED, train=0)
    return str(out)
