"""`tbhpc report RUN` for a training run: the per-step table and curves from `train_steps`
(the same rows the console printed), as Markdown + HTML + PNG like campaign reports."""
from __future__ import annotations

from pathlib import Path

from tbhpc.errors import UserError
from tbhpc.report import plots
from tbhpc.report.build import markdown_to_html
from tbhpc.store.run_dir import RunDir
from tbhpc.train.record import read_steps

COLUMNS = ("step", "policy_version", "reward_mean", "mixed_share", "kept", "drawn", "dropped", "reruns", "tokens",
           "loss", "grad_norm", "clip_fraction", "mismatch", "rollout_s", "update_s", "publish_s", "sync_s", "wait_s")


def steps_markdown(steps: list[dict]) -> str:
    """The per-step table (pure)."""
    def cell(v):
        return f"{v:.4g}" if isinstance(v, float) else str(v)
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cell(r.get(c, "")) for c in COLUMNS) + " |" for r in steps]
    return "\n".join(lines)


def staleness_markdown(steps: list[dict]) -> str:
    """Off-policy runs: each step's loss tokens by age (updates behind the weights trained), and the
    clip, truncation and engine mismatch of each age (pure; '' for on-policy runs and for steps
    recorded before the split existed)."""
    rows = [r for r in steps if r.get("staleness_tokens") and (r.get("max_staleness") or 0) >= 1]
    if not rows:
        return ""
    ages = max(len(r["staleness_tokens"]) for r in rows)
    head = (["step"] + [f"age {a} tokens" for a in range(ages)] + [f"clip {a}" for a in range(ages)]
            + [f"truncated {a}" for a in range(ages)] + [f"mismatch {a}" for a in range(ages)]
            + ["spanning", "re-issued", "re-prefilled"])

    def padded(r, key):
        xs = list(r.get(key) or [])
        return xs + [0] * (ages - len(xs))

    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        n = padded(r, "staleness_tokens")
        total = sum(n) or 1
        cells = ([str(r["step"])] + [f"{t} ({100 * t / total:.0f}%)" for t in n]
                 + [f"{x:.3f}" for x in padded(r, "clip_by_staleness")] + [f"{x:.3f}" for x in padded(r, "truncated_by_staleness")]
                 + [f"{x:.2e}" for x in padded(r, "mismatch_by_staleness")]
                 + [str(r.get("spanning", 0)), str(r.get("reissued", 0)), str(r.get("reprefilled", 0))])
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def build_train_report(run_path: Path, out: Path) -> tuple[Path, Path]:
    run = RunDir(Path(run_path)).require()
    steps = read_steps(run)
    if not steps:
        raise UserError(f"{run.path}: no training steps recorded yet (logs/train_steps.jsonl)")
    out.mkdir(parents=True, exist_ok=True)
    image = plots.train_curves(steps, out / "train_curves.png")
    timeline = plots.train_timeline(steps, out / "train_timeline.png")
    name = run.campaign()["campaign"]
    md = "\n".join([f"# Training report: {name}", "", f"Run: `{run.path}`", "",
                    f"{len(steps)} steps; last weights `exports/` (HF format).", "", "## Steps", "",
                    steps_markdown(steps), "", "## Curves", "", f"![{image.stem}]({image.name})"]
                   + (["", "## Timeline", "", f"![{timeline.stem}]({timeline.name})"] if timeline else [])
                   + (["", "## Staleness", "", "Loss tokens by age (updates behind the weights the step trains), "
                       "and the figures of each age.", "", ages] if (ages := staleness_markdown(steps)) else [])) + "\n"
    md_path, html_path = out / "report.md", out / "report.html"
    md_path.write_text(md, encoding="utf-8")
    html_path.write_text(markdown_to_html(md, f"Training report: {name}"), encoding="utf-8")
    return md_path, html_path
