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
                   + (["", "## Timeline", "", f"![{timeline.stem}]({timeline.name})"] if timeline else [])) + "\n"
    md_path, html_path = out / "report.md", out / "report.html"
    md_path.write_text(md, encoding="utf-8")
    html_path.write_text(markdown_to_html(md, f"Training report: {name}"), encoding="utf-8")
    return md_path, html_path
