"""A training run's dealings with the scheduler around it: the preemption signal (caught, then a
requeue), the signal's margin against the measured step, the serving job that ends with the run
(also when a lost peer ends it, or when `tbhpc submit train --wait` stops following it),
evaluations of exports submitted beside it. Kept out of the step loop (loop.py), which calls them."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import asdict
from datetime import datetime
from pathlib import Path

from tbhpc.errors import UserError
from tbhpc.serve.checkpoints import version_name
from tbhpc.serve.endpoint import endpoint_path, read_endpoint, remove_endpoint
from tbhpc.slurm_options import OUTBOX_ENV, REQUEUE_ENV
from tbhpc.train.config import TrainConfig
from tbhpc.train.watch import Watch, die

STOPPED = 3     # exit status of a run stopped by a signal outside Slurm (run the same command to resume)


def stop_on_signals(stop: threading.Event, rank: int) -> None:
    """USR2 and SIGTERM (Slurm's warning before a time limit or preemption) set `stop`: every rank
    then stops at the loop's next safe point. Only the main thread can install handlers."""
    if threading.current_thread() is not threading.main_thread():
        return

    def caught(signum, _frame) -> None:
        first = not stop.is_set()
        stop.set()
        if first:   # os.write, not print: the handler may interrupt the main thread's print on this stream
            try:
                os.write(2, f"train: rank {rank} got {signal.Signals(signum).name} at "
                            f"{datetime.now().strftime('%H:%M:%S.%f')[:-3]}; stopping at the next safe point\n".encode())
            except OSError:
                pass    # stderr gone (a closed pipe): stopping matters, the line does not

    for sig in (signal.SIGUSR2, signal.SIGTERM):
        signal.signal(sig, caught)


def end_run(watch: Watch, run: Path, line: str) -> None:
    """A peer is lost (train/watch.py): end the run now: its serving job cancelled, this process ended
    with one line (srun --kill-on-bad-exit ends the other ranks). No barrier: nobody would come."""
    watch.stop()
    try:
        stop_serving_job(run)
    except Exception:       # the one line below matters more than the cleanup
        pass
    die(line)


def preemption_margin(signal_s: float, update_s: float, publish_s: float, factor: float = 1.5) -> str:
    """'' when the signal Slurm sends before the time limit leaves room to finish a step's update,
    checkpoint and publication (measured on this run, with `factor` to spare); else the warning."""
    need = factor * (update_s + publish_s)
    if signal_s >= need:
        return ""
    return (f"Slurm signals {signal_s:g} s before the time limit, less than {factor:g} x this run's update + checkpoint "
            f"+ publication ({update_s + publish_s:.0f} s): a step caught by it may not be saved; raise slurm.signal_seconds "
            f"to {int(need + 0.999)} or more")


def stop_serving_job(run: Path, log=None) -> None:
    """A run submitted with `tbhpc submit train` ends its serving job with its training (finished or failed).
    In a container (no scancel there) the job's script does it when the ranks have ended."""
    import yaml
    if os.environ.get(REQUEUE_ENV):
        return
    jobs = Path(run) / "slurm" / "train-jobs.yaml"
    if jobs.exists() and (serve := (yaml.safe_load(jobs.read_text()) or {}).get("serve")):
        cancel_and_wait(str(serve), Path(run))
        if log:
            log(f"train: cancelled the serving job {serve}")


REQUEUED_PREFIX = "requeued-"     # RUN/slurm/requeued-JOB-RESTARTS: the trainer's script then keeps its server


def requeue_marker(run: Path, job: str, restarts: str | None) -> Path:
    return Path(run) / "slurm" / f"{REQUEUED_PREFIX}{job}-{restarts or 0}"


def requeue_or_exit(rank0: bool, log=print, run: Path | None = None) -> int:
    """After Preempted: under Slurm, rank 0 requeues the job (it restarts from the checkpoint) and
    says so in `run` first, so that the job's script does not cancel the serving job as it does when
    the run ends in any other way; elsewhere the caller exits with STOPPED and the same command resumes."""
    job = os.environ.get("SLURM_JOB_ID")
    if job and rank0:
        if run is not None:
            marker = requeue_marker(run, job, os.environ.get("SLURM_RESTART_COUNT"))
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.touch()
            if os.environ.get(REQUEUE_ENV):     # in a container: the job's script requeues on the marker
                log(f"train: the job's script requeues job {job} ({marker.name})")
                return 0
        out = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True)
        log(f"train: requeued job {job}" if out.returncode == 0 else f"train: scontrol requeue {job} failed: {out.stderr.strip()}")
    return 0 if job else STOPPED


_SUBMITTERS: list[subprocess.Popen] = []     # `tbhpc submit eval` processes of this trainer (under Slurm)


def finish_submissions(timeout_s: float = 120.0, log=print) -> None:
    """Wait for the export evals this process is still submitting: Slurm ends whatever is left of
    a job step when its ranks exit, and the last export's submission starts moments before."""
    deadline = time.monotonic() + timeout_s
    for proc in _SUBMITTERS:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log(f"train: an export eval's submission (pid {proc.pid}) is still running after {timeout_s:.0f} s; "
                "it ends with this job step")
    _SUBMITTERS.clear()


def eval_container(cfg: TrainConfig) -> list[str]:
    """The trainer's container for its export evals, unless their config names its own: their
    scripts name the interpreter this process runs, which is the image's."""
    if not cfg.slurm.container.runtime:
        return []
    from tbhpc.campaign.config import load_campaign    # the campaign package, only for runs that evaluate exports
    if (load_campaign(cfg.export_eval, "eval", cfg.export_eval_overrides).slurm.get("container") or {}).get("runtime"):
        return []
    return ["slurm.container=" + json.dumps(asdict(cfg.slurm.container))]


def start_export_eval(cfg: TrainConfig, run_path: Path, step: int, export: Path) -> str:
    """Evaluate an export without holding up training: under Slurm a submitted eval pipeline
    (array -> merge -> agg), elsewhere a detached local campaign; results in RUN/evals/step-N."""
    import sys
    out = run_path / "evals" / version_name(step)
    args = ["--config", cfg.export_eval, "--out", str(out), "policy=tokens",
            f"policy_opts={{generator: local, model_path: {export}, max_tokens: {cfg.max_tokens}, "
            f"response_budget: {cfg.response_budget}}}", *eval_container(cfg), *cfg.export_eval_overrides]
    if os.environ.get("SLURM_JOB_ID"):              # the pipeline's last stage is `tbhpc agg`
        cmd = [sys.executable, "-m", "tbhpc.cli", "submit", "eval", *args]
        if not shutil.which("sbatch") and not os.environ.get(OUTBOX_ENV):   # an image, and no script to submit for it
            return (f"train: no sbatch here (a container without Slurm's client): {export.name} is not evaluated; "
                    f"from a login node: tbhpc submit eval {shlex.join(args)}")
    else:                                           # its agg logs the eval to the run's trackers
        cli = [sys.executable, "-m", "tbhpc.cli"]
        cmd = ["sh", "-c", f"{shlex.join([*cli, 'eval', *args])} && "
                           f"{shlex.join([*cli, 'agg', str(out), '--format', 'md'])} > {shlex.quote(str(out / 'summary.md'))}"]
    log = run_path / "logs" / f"eval-{version_name(step)}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}   # wandb's helper of this process, not the eval's
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    if os.environ.get("SLURM_JOB_ID"):
        _SUBMITTERS.append(proc)
    return f"train: evaluating {export.name} in {out} ({'submitted' if os.environ.get('SLURM_JOB_ID') else 'local'}; log {log})"


def cancel_and_wait(job: str, run: Path | None = None, timeout_s: float = 60.0) -> None:
    """scancel, then wait until the job has left the queue: the server's supervisor gets its
    SIGTERM, stops vLLM and removes endpoint.json before anything tears the allocation down. An
    endpoint file still naming the job after it is gone (the supervisor was killed) is removed."""
    subprocess.run(["scancel", job], capture_output=True)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True).stdout.strip():
            break
        time.sleep(0.5)
    if run is not None and endpoint_path(run).exists():
        try:
            stale = read_endpoint(run).job_id == job
        except UserError:
            stale = False
        if stale:
            remove_endpoint(run)
