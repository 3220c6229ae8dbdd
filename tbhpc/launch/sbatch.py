"""Pure sbatch renderers: (options, paths, sizes) -> script text. Golden-tested; `--dry-run`
prints exactly what would be submitted.

Every script is readable on its own: the #SBATCH header says what it asks for, the body is one
command. Array tasks exec Python so that USR2/SIGTERM reach the worker directly. With
`slurm.container`, the body is one srun step inside the image instead, and the script requeues
(launch/container.py says why).
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass

from tbhpc.launch.container import env_exports, step_line
from tbhpc.slurm_options import REQUEUE_EXIT, SlurmOptions


@dataclass(frozen=True)
class Stage:
    """Where a submitted stage lives (all absolute paths inside the run directory)."""

    run: str            # run directory
    stage: int          # stage number within the run (resubmissions get new numbers)
    name: str           # campaign name, used in job names
    workdir: str        # where jobs start (the repository or the user's cwd)

    @property
    def dir(self) -> str:
        return f"{self.run}/slurm/stage-{self.stage:03d}"

    @property
    def logs(self) -> str:
        return f"{self.run}/logs/slurm"


def common_header(opts: SlurmOptions, job_name: str, out: str, time: str | None = None) -> list[str]:
    lines = [f"--job-name={job_name}", f"--output={out}", "--open-mode=append", "--chdir=WORKDIR",
             f"--time={time or opts.time}", f"--cpus-per-task={opts.cpus_per_task}"]
    for flag, value in (("partition", opts.partition), ("account", opts.account), ("qos", opts.qos),
                        ("mem", opts.mem), ("gres", opts.gres), ("nice", opts.nice)):
        if value is not None:
            lines.append(f"--{flag}={value}")
    return lines + list(opts.extra_sbatch)


def env_lines(env: dict[str, str]) -> list[str]:
    """`export NAME=value` lines (values shell-quoted), in the order given."""
    return [f"export {k}={shlex.quote(v)}" for k, v in env.items()]


def script_text(header: list[str], body: list[str], workdir: str) -> str:
    head = "\n".join(f"#SBATCH {h}".replace("WORKDIR", workdir) for h in header)
    return "#!/bin/bash\n" + head + "\nset -euo pipefail\nexport OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1\n" + "\n".join(body) + "\n"


def signal_flag(opts: SlurmOptions) -> str:
    """USR2 before the time limit: to the batch shell, which execs the work; in a container to the
    step, where the work is (the shell stays outside)."""
    return f"--signal={'' if opts.container.runtime else 'B:'}USR2@{opts.signal_seconds}"


def uses_gpus(opts: SlurmOptions) -> bool:
    return "gpu" in (opts.gres or "")


def render_array(stage: Stage, opts: SlurmOptions, n_tasks: int, indices: str | None = None) -> str:
    """One array task per chunk line of `chunks.jsonl`; `indices` resubmits a subset (e.g. "3,7")."""
    spec = indices if indices is not None else f"0-{n_tasks - 1}"
    header = [f"--array={spec}%{opts.array_parallelism}", "--requeue", signal_flag(opts),
              "--ntasks=1"] + common_header(opts, f"tbhpc-{stage.name}", f"{stage.logs}/%x-%A_%a.out")
    command = [opts.job_python, "-m", "tbhpc.launch.array_task", stage.run, str(stage.stage)]
    body = [f"export TBHPC_FLUSH_EVERY={opts.flush_every}"]
    if not opts.container.runtime:
        body.append("exec " + " ".join(shlex.quote(c) for c in command))
        return script_text(header, body, stage.workdir)
    body += env_exports(opts.container, requeue=True) + [
        "rc=0",
        step_line(opts.container, ["srun", "--ntasks=1", f"--cpus-per-task={opts.cpus_per_task}"], command,
                  stage.workdir, [stage.run], uses_gpus(opts)) + " || rc=$?",
        f'if [ "$rc" -eq {REQUEUE_EXIT} ]; then scontrol requeue "${{SLURM_ARRAY_JOB_ID}}_${{SLURM_ARRAY_TASK_ID}}"; exit 0; fi',
        'exit "$rc"']
    return script_text(header, body, stage.workdir)


def render_step(stage: Stage, opts: SlurmOptions, step: str, command: list[str], dependency: str | None) -> str:
    """A small CPU step after the array (merge, agg, select): afterany, so it runs even when some
    array tasks failed, and reports what is missing."""
    header = common_header(opts, f"tbhpc-{stage.name}-{step}", f"{stage.logs}/%x-%j.out", time="00:30:00") + ["--ntasks=1"]
    if dependency:
        header.insert(0, f"--dependency=afterany:{dependency}")
    command = [opts.job_python, "-m", "tbhpc.cli", *command]
    if opts.container.runtime:
        body = env_exports(opts.container) + [step_line(opts.container, ["srun", "--ntasks=1"], command, stage.workdir,
                                                        [stage.run], False)]
    else:
        body = [" ".join(shlex.quote(c) for c in command)]
    return script_text(header, body, stage.workdir)


def render_mpi(stage: Stage, opts: SlurmOptions) -> str:
    """MPI mode: one allocation of `ntasks` ranks over `nodes` nodes; rank 0 hands out chunks."""
    header = [f"--nodes={opts.nodes}", f"--ntasks={opts.ntasks}", "--requeue", signal_flag(opts)] + \
        common_header(opts, f"tbhpc-{stage.name}-mpi", f"{stage.logs}/%x-%j.out")
    # --cpus-per-task again: since Slurm 22.05 a step does not inherit the job's
    srun = ["srun", f"--mpi={opts.mpi}", f"--cpus-per-task={opts.cpus_per_task}"]
    command = [opts.job_python, "-m", "tbhpc.launch.mpi_worker", stage.run, str(stage.stage)]
    body = [f"export TBHPC_FLUSH_EVERY={opts.flush_every}", *env_exports(opts.container),
            step_line(opts.container, srun, command, stage.workdir, [stage.run], uses_gpus(opts))]
    return script_text(header, body, stage.workdir)


def render_serve(run: str, config_path: str, opts: SlurmOptions, workdir: str, gpus: int = 0,
                 env: dict[str, str] | None = None) -> str:
    """The policy server job: `tbhpc serve` supervises vLLM on the allocated node, publishes
    RUN/endpoint.json with the node's name, and stops vLLM when Slurm ends the job (SIGTERM
    reaches the supervisor: the body execs it). `env`: exported first (NCCL settings)."""
    header = ["--ntasks=1", "--nodes=1"] + common_header(opts, "tbhpc-serve", f"{run}/logs/slurm/%x-%j.out")
    if gpus and not opts.gres:
        header.append(f"--gres=gpu:{gpus}")
    command = [opts.job_python, "-m", "tbhpc.cli", "serve", run, "--config", config_path, "host=0.0.0.0"]
    body = env_lines(env or {}) + ["# vLLM runs from its own environment (ServeConfig.python); this process only supervises it"]
    if opts.container.runtime:      # srun forwards scancel's SIGTERM to the supervisor in the image
        body += env_exports(opts.container) + [
            "exec " + step_line(opts.container, ["srun", "--ntasks=1", f"--cpus-per-task={opts.cpus_per_task}"], command,
                                workdir, [run], bool(gpus) or uses_gpus(opts))]
    else:
        body.append("exec " + " ".join(shlex.quote(c) for c in command))
    return script_text(header, body, workdir)
