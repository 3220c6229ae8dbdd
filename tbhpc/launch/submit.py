"""`tbhpc submit probe|eval`: fire-and-forget submission of a campaign stage as a chained
pipeline: array (the attempts) -> merge (afterany: runs even if tasks failed) -> agg for eval or
select for probe (afterok on the merge). `--dry-run` prints the scripts and submits nothing.
"""
from __future__ import annotations

from pathlib import Path

from tbhpc.slurm_options import SlurmOptions
from tbhpc.launch.sbatch import Stage, render_array, render_step
from tbhpc.launch.slurm import SlurmClient
from tbhpc.launch.stages import record_jobs, stage_dir, write_chunks

ARRAY_PLACEHOLDER, MERGE_PLACEHOLDER = "${ARRAY_JOB_ID}", "${MERGE_JOB_ID}"


def final_step(kind: str, run: str) -> tuple[str, list[str]]:
    if kind == "probe":
        return "select", ["select", run, "--out", f"{run}/pool.yaml"]
    return "agg", ["agg", run, "--format", "md", "--allow-incomplete"]


def render_pipeline(stage: Stage, opts: SlurmOptions, n_tasks: int, kind: str,
                    array_job: str = ARRAY_PLACEHOLDER, merge_job: str = MERGE_PLACEHOLDER) -> dict[str, str]:
    """The scripts of one submitted stage, in submission order (pure: golden-tested)."""
    step, command = final_step(kind, stage.run)
    return {
        "array.sbatch": render_array(stage, opts, n_tasks),
        "merge.sbatch": render_step(stage, opts, "merge", ["merge", stage.run], array_job),
        f"{step}.sbatch": render_step(stage, opts, step, command, merge_job).replace(
            f"--dependency=afterany:{merge_job}", f"--dependency=afterok:{merge_job}"),
    }


def dry_run_text(scripts: dict[str, str]) -> str:
    return "".join(f"# ---- {name} ----\n{text}" for name, text in scripts.items())


def submit_pipeline(stage: Stage, opts: SlurmOptions, tasks: list, kind: str, client: SlurmClient) -> dict[str, str]:
    """Write chunks and scripts into the stage directory and submit them chained; returns job ids."""
    from tbhpc.store.run_dir import RunDir
    run = RunDir(Path(stage.run))
    write_chunks(run, stage.stage, tasks)
    (run.logs / "slurm").mkdir(parents=True, exist_ok=True)
    d = stage_dir(run, stage.stage)
    jobs: dict[str, str] = {}
    names = list(render_pipeline(stage, opts, len(tasks), kind))
    for name in names:  # render each with the real ids of the jobs it depends on
        script = render_pipeline(stage, opts, len(tasks), kind, jobs.get("array", ARRAY_PLACEHOLDER),
                                 jobs.get("merge", MERGE_PLACEHOLDER))[name]
        (d / name).write_text(script, encoding="utf-8")
        jobs[name.split(".")[0]] = client.sbatch(d / name)
    record_jobs(run, stage.stage, {**jobs, "tasks": len(tasks)})
    return jobs


def submit_campaign(cfg, out: Path, dry_run: bool = False, client: SlurmClient | None = None, workdir: str | None = None) -> str:
    """Plan the pending keys of a campaign and submit (or print) its pipeline; returns a report."""
    import math
    import os

    from tbhpc.campaign.runner import pending_keys, plan_campaign
    from tbhpc.campaign.config import campaign_tasks, plan_rows
    from tbhpc.config import from_dict
    from tbhpc.launch.stages import next_stage
    from tbhpc.store.run_dir import RunDir

    opts = from_dict(SlurmOptions, cfg.slurm, {k: "config field 'slurm'" for k in cfg.slurm})
    run_path = Path(out).resolve()
    workdir = workdir or os.getcwd()
    if dry_run:  # touch nothing: plan as if the run were new (or resume it read-only)
        from tbhpc.campaign.runner import check_same_campaign
        from tbhpc.outpaths import check_run_folder
        check_run_folder(Path(out), cfg.kind)
        run = RunDir(run_path)
        if run.exists():
            check_same_campaign(run, cfg)
        if run.exists() and run.db.exists():
            keys, _ = pending_keys(run, run.plan())
        else:
            keys = [(r["task_id"], i) for r in plan_rows(campaign_tasks(cfg), cfg.repeats) for i in range(r["repeats"])]
        stage = next_stage(run) if run.exists() else 1
        n_tasks = math.ceil(len(keys) / opts.task_size(len(keys))) if keys else 0
        head = f"# {len(keys)} attempts -> {n_tasks} array task(s) of <= {opts.task_size(len(keys))}\n"
        return head + dry_run_text(render_pipeline(Stage(str(run_path), stage, cfg.name, workdir), opts, max(n_tasks, 1), cfg.kind))
    plan = plan_campaign(cfg, run_path)
    run, keys, planned = plan.run, plan.keys, plan.planned
    if not keys:
        return f"{run_path}: all {planned} attempts are done; nothing to submit"
    size = opts.task_size(len(keys))
    tasks = [keys[i:i + size] for i in range(0, len(keys), size)]
    stage = Stage(str(run_path), next_stage(run), cfg.name, workdir)
    jobs = submit_pipeline(stage, opts, tasks, cfg.kind, client or SlurmClient())
    return (f"{run_path}: stage {stage.stage}: {len(keys)} attempts in {len(tasks)} array task(s); jobs "
            + ", ".join(f"{k} {v}" for k, v in jobs.items()) + f"\nfollow with: tbhpc status {run_path}")
