"""`tbhpc submit train`: the serving job and the trainer job of one run, tied by the run directory.

Why two jobs and not one heterogeneous job: the two halves live differently. The server holds
its GPUs for the whole run, survives trainer requeues (it keeps serving the newest verified
weights) and may sit on another partition; the trainer is requeued on preemption or a time
limit and resumes from its DeepSpeed checkpoint. A het job is scheduled, requeued and ended as
one unit, so a trainer requeue would also restart the server (minutes of vLLM start-up).
The trainer job depends on the server job having *started* (`--dependency=after:`) and finds it
through `RUN/endpoint.json`, the same file every other client reads.

Inside the trainer allocation `srun` starts one process per GPU (one per node on CPU nodes); rank,
world size and local rank come from Slurm's environment (SLURM_PROCID, SLURM_NTASKS,
SLURM_LOCALID), the master address is the first node's address and the port derives from the job
id. No Ray, no pdsh, no launcher of our own. NCCL settings (NCCL_IB_HCA, NCCL_SOCKET_IFNAME, ...)
go in the config's `env` (exported in both scripts) or pass through from the submitting shell
(sbatch exports the environment by default).
"""
from __future__ import annotations

import os
import shlex
import subprocess
from dataclasses import asdict
from pathlib import Path

import yaml

from tbhpc.errors import UserError
from tbhpc.launch.container import env_exports, outbox_stop, outbox_watch, step_line
from tbhpc.launch.sbatch import common_header, env_lines, render_serve, script_text
from tbhpc.train.config import TrainConfig
from tbhpc.train.jobs import REQUEUED_PREFIX, cancel_and_wait

SERVE_PLACEHOLDER = "${SERVE_JOB_ID}"


def rollout_line(cfg: TrainConfig, replicas: int | None) -> str:
    """What the rollouts will ask of the server, in numbers (a comment of the trainer's script)."""
    ranks = cfg.nodes * (cfg.gpus_per_node or 1)
    per_rank = cfg.in_flight_per_rank(ranks)
    against = f" against {replicas} vLLM replica{'s' if replicas != 1 else ''}" if replicas else ""
    return (f"# rollouts: {ranks} ranks x {per_rank} episodes in flight = {ranks * per_rank} (episodes_in_flight "
            f"{cfg.episodes_in_flight}){against}; a generation request times out after {cfg.request_timeout_s:,.0f} s "
            f"(max_tokens {cfg.max_tokens:,} at {cfg.request_floor_tokens_per_s:g} tokens/s + 60 s)")


def run_env(cfg: TrainConfig) -> dict[str, str]:
    """What both jobs of a run export: the config's `env`, and on GPUs one NCCL_CUMEM_ENABLE for the
    trainer and vLLM. vLLM sets it to 0 when it is imported unless told otherwise, torch's NCCL leaves
    NCCL's default (1), and the weight broadcast puts both in one communicator, which wants one setting.
    0 is vLLM's choice (cuMem costs GPU memory under CUDA graphs); a config's own value wins, in both."""
    if not cfg.gpus_per_node or "NCCL_CUMEM_ENABLE" in cfg.env:
        return dict(cfg.env)
    return {"NCCL_CUMEM_ENABLE": "0", **cfg.env}


def render_train(run: str, config_path: str, cfg: TrainConfig, workdir: str, serve_job: str | None = None,
                 replicas: int | None = None) -> str:
    """The trainer job (pure: golden-tested). `replicas`: the serving job's vLLM replicas (a comment)."""
    opts = cfg.slurm
    per_node = cfg.gpus_per_node or 1
    header = [f"--nodes={cfg.nodes}", f"--ntasks-per-node={per_node}", "--requeue",
              f"--signal=USR2@{opts.signal_seconds}"]
    if serve_job:
        header.insert(0, f"--dependency=after:{serve_job}")
    header += common_header(opts, f"tbhpc-train-{cfg.name}", f"{run}/logs/slurm/%x-%j.out")
    if cfg.gpus_per_node and not opts.gres:
        header.append(f"--gpus-per-node={cfg.gpus_per_node}")
    command = [opts.job_python, "-m", "tbhpc.cli", "train", run, "--config", config_path]
    srun = ["srun", "--kill-on-bad-exit=1", f"--cpus-per-task={opts.cpus_per_task}"]
    container = opts.container.runtime
    body = [
        "# rank 0's node hosts the rendezvous on MASTER_PORT and the draw queue on MASTER_PORT+1 (ports from the job id,",
        "# in 20000-32765: below the kernel's ephemeral range, where an outgoing connection may already hold a port)",
        'first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)',
        'export MASTER_ADDR=$(scontrol show node "$first" | sed -n \'s/.*NodeAddr=\\([^ ]*\\).*/\\1/p\')',
        "export MASTER_PORT=$((20000 + 2 * (SLURM_JOB_ID % 6383)))",
        f"export OMP_NUM_THREADS={cfg.torch_threads}",
        *env_lines(run_env(cfg)),
        *env_exports(opts.container, requeue=True),
        *(outbox_watch(f"{run}/slurm/outbox") if container and cfg.export_eval else []),
        *([rollout_line(cfg, replicas)] if cfg.generator == "server" else []),
        "# USR2 (before the time limit) and SIGTERM (preemption) reach every rank: they checkpoint, rank 0 requeues.",
        "# srun is given --cpus-per-task: since Slurm 22.05 a step no longer inherits the job's",
        step_line(opts.container, srun, command, workdir, [run], bool(cfg.gpus_per_node)),
    ]
    marker = f"{shlex.quote(run)}/slurm/{REQUEUED_PREFIX}$SLURM_JOB_ID-${{SLURM_RESTART_COUNT:-0}}"
    if serve_job or container:
        body[-1] = "rc=0\n" + body[-1] + " || rc=$?"
    if container and cfg.export_eval:
        body.append(outbox_stop())
    if container:
        body += ["# rank 0 in the image cannot reach scontrol: its marker asks this script to requeue the job",
                 f'if [ -e {marker} ]; then scontrol requeue "$SLURM_JOB_ID"; exit 0; fi']
    if serve_job:
        body += ["# the serving job ends with the run however its ranks ended (an error, a signal, NCCL's watchdog",
                 "# aborting a rank), unless rank 0 requeued this job: it resumes against the same server",
                 f"[ -e {marker} ] || scancel {serve_job} || true"]
    if serve_job or container:
        body.append("exit $rc")
    return script_text(header, body, workdir)


def serve_config_for(cfg: TrainConfig):
    """The serving job's config: the train config's serve_config file + its `serve` overrides,
    serving the run's initial model. From max_staleness 2 on, a sync aborts in-flight turns
    (`pause_mode: abort`, unless either sets it): they are issued again on the new weights, where
    `wait` would hold every new version back until the longest turn ends."""
    from tbhpc.config import from_dict, merge_sections
    from tbhpc.serve.config import ServeConfig
    base = {}
    if cfg.serve_config:
        path = Path(cfg.serve_config)
        if not path.exists():
            raise UserError(f"train config: field 'serve_config': {path} does not exist")
        base = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    values = {**merge_sections(ServeConfig, base, cfg.serve), "model": cfg.model}   # serve: {slurm: {time: ..}} keeps the file's mem
    if cfg.max_staleness >= 2:
        values.setdefault("pause_mode", "abort")
    if cfg.adapter_sync:        # the server serves the base with LoRA on and loads each step's adapter
        values.setdefault("lora_rank", cfg.lora_rank)
    scfg = from_dict(ServeConfig, values, {k: "train config field 'serve'" for k in cfg.serve})
    scfg.validate("train config (serve)")
    return scfg


def render_train_pipeline(run: str, cfg: TrainConfig, workdir: str, serve_job: str = SERVE_PLACEHOLDER) -> dict[str, str]:
    """Every script of a training run, in submission order."""
    scripts, replicas = {}, None
    if cfg.generator == "server":
        scfg = serve_config_for(cfg)
        gpus = scfg.tensor_parallel_size * scfg.data_parallel_size if cfg.gpus_per_node else 0
        replicas = scfg.data_parallel_size
        scripts["serve.sbatch"] = render_serve(run, f"{run}/serve.yaml", scfg.slurm, workdir, gpus=gpus, env=run_env(cfg))
    scripts["train.sbatch"] = render_train(run, f"{run}/train.yaml", cfg, workdir,
                                           serve_job if cfg.generator == "server" else None, replicas)
    return scripts


def submit_train(cfg: TrainConfig, out: Path, dry_run: bool = False, workdir: str | None = None,
                 wait: bool = False, log=print) -> str:
    from tbhpc.launch.submit import dry_run_text
    run = Path(out).resolve()
    workdir = workdir or os.getcwd()
    if dry_run:
        return dry_run_text(render_train_pipeline(str(run), cfg, workdir))
    (run / "logs" / "slurm").mkdir(parents=True, exist_ok=True)
    (run / "slurm").mkdir(parents=True, exist_ok=True)
    (run / "train.yaml").write_text(yaml.safe_dump(asdict(cfg), sort_keys=False), encoding="utf-8")
    jobs: dict[str, str] = {}
    if cfg.generator == "server":
        from tbhpc.serve.auth import ensure_token
        ensure_token(run)       # before any job: the run's server answers only its holders
        (run / "serve.yaml").write_text(yaml.safe_dump(asdict(serve_config_for(cfg)), sort_keys=False), encoding="utf-8")
    for name, _ in render_train_pipeline(str(run), cfg, workdir).items():
        text = render_train_pipeline(str(run), cfg, workdir, jobs.get("serve", SERVE_PLACEHOLDER))[name]
        path = run / "slurm" / name
        path.write_text(text, encoding="utf-8")
        jobs[name.split(".")[0]] = _sbatch(path)
    (run / "slurm" / "train-jobs.yaml").write_text(yaml.safe_dump(jobs), encoding="utf-8")
    log(f"{run}: " + ", ".join(f"{k} job {v}" for k, v in jobs.items()))
    if wait:
        return follow_train(run, jobs, cfg.steps, log)
    return (f"{run}: " + ", ".join(f"{k} job {v}" for k, v in jobs.items())
            + f"\nfollow with: tail -f {run}/logs/slurm/*.out; results: {run}/results.duckdb (train_steps, attempts)")


def _sbatch(path: Path) -> str:
    out = subprocess.run(["sbatch", "--parsable", str(path)], capture_output=True, text=True)
    if out.returncode != 0:
        raise UserError(f"sbatch {path}: {out.stderr.strip() or out.stdout.strip()}")
    return out.stdout.strip().split(";")[0]


def follow_train(run: Path, jobs: dict[str, str], steps: int, log=print, poll_s: float = 2.0) -> str:
    """Wait for the trainer job (through requeues), printing each step's line as it lands; cancel
    the serving job at the end whatever happened. Raises UserError if the run did not finish."""
    import time

    from tbhpc.store.run_dir import RunDir
    from tbhpc.train.record import read_steps, step_line
    shown = 0
    try:
        while True:
            state = subprocess.run(["squeue", "-h", "-j", jobs["train"], "-o", "%T"], capture_output=True,
                                   text=True).stdout.strip()
            rows = read_steps(RunDir(run))
            for row in rows[shown:]:
                log(step_line(row))
            shown = len(rows)
            if not state:
                break
            time.sleep(poll_s)
    finally:
        if "serve" in jobs:
            cancel_and_wait(jobs["serve"], run)
    done = max((int(r["step"]) for r in read_steps(RunDir(run))), default=0)
    ended_early = (run / "exports" / f"step-{done:06d}" / "config.json").exists()   # collapse guard, max_seconds
    if done < steps and not ended_early:
        raise UserError(f"{run}: the trainer job {jobs['train']} ended after step {done} of {steps}; "
                        f"see {run}/logs/slurm/tbhpc-train-*-{jobs['train']}.out")
    return f"{run}: {done} steps done; HF export in {run}/exports/step-{done:06d}"


def cancel_jobs(jobs) -> None:
    """scancel each job of a run (the API's `Training.cancel`); a job already gone is no error."""
    for job in jobs:
        subprocess.run(["scancel", str(job)], capture_output=True, check=False)
