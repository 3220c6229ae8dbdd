"""How a rendered script runs its work inside a container (pure: golden-tested with sbatch.py).

One rule for every runtime: the batch script stays on the host and is the only part that talks to
Slurm; the work (an array task, the MPI ranks, the trainer's ranks, the serving supervisor and its
vLLM) is one `srun` step inside the image. Why: images rarely carry Slurm's client, its config and
munge's socket, so a process inside cannot `scontrol requeue` itself. It exits REQUEUE_EXIT (or,
for the trainer, leaves its marker) and the script requeues the job from outside. Signals Slurm
sends before a time limit go to the steps (`--signal=USR2@N`, not `B:`), which is where the work is.

pyxis puts the step in the image through srun's own flags; apptainer and charliecloud wrap the
command (`apptainer exec IMAGE ...`, `ch-run IMAGE -- ...`). All three pass the job's environment
through; the config's `env` is exported in the script and named again where an image's own
variables would otherwise win (pyxis --container-env, apptainer --env).
"""
from __future__ import annotations

import shlex

from tbhpc.slurm_options import OUTBOX_ENV, REQUEUE_ENV, REQUEUE_EXIT, ContainerOptions, check_mount


def mounts(c: ContainerOptions, always: list[str]) -> list[tuple[str, str, str]]:
    """The config's mounts, then each path of `always` (the working and run directories) at its own
    place unless a mount already shows it there."""
    out = [check_mount(m, c.runtime, "slurm option 'container': field 'mounts'") for m in c.mounts]
    for path in always:
        path = path.rstrip("/") or "/"
        if not any(path == dst or path.startswith(dst.rstrip("/") + "/") for _, dst, _ in out):
            out.append((path, path, ""))
    return out


def step_prefix(c: ContainerOptions, workdir: str, always: list[str], gpus: bool) -> tuple[list[str], list[str]]:
    """(srun flags, command prefix) that put one srun step's command inside the image."""
    binds = mounts(c, [workdir, *always])
    if c.runtime == "pyxis":
        spec = ",".join(f"{s}:{d}" + (f":{f}" if f else "") for s, d, f in binds)
        flags = [f"--container-image={c.image}", f"--container-mounts={spec}", f"--container-workdir={workdir}"]
        if c.env:
            flags.append(f"--container-env={','.join(c.env)}")
        return flags, []
    if c.runtime == "apptainer":
        prefix = ["apptainer", "exec"] + (["--nv"] if gpus else [])
        for s, d, f in binds:
            prefix += ["--bind", f"{s}:{d}" + (f":{f}" if f else "")]
        for name, value in c.env.items():
            prefix += ["--env", f"{name}={value}"]
        return [], prefix + ["--pwd", workdir, c.image]
    prefix = ["ch-run"]                                   # charliecloud: ch-run passes the environment through
    for s, d, _ in binds:
        prefix += [f"--bind={s}:{d}"]
    return [], prefix + [f"--cd={workdir}", c.image, "--"]


def env_exports(c: ContainerOptions, requeue: bool = False) -> list[str]:
    """What the script exports before its step: the config's env, the requeue protocol for work
    that requeues itself, and for charliecloud a USER (ch-run refuses to start without one).
    Nothing without a container."""
    if not c.runtime:
        return []
    lines = [f"export {k}={shlex.quote(v)}" for k, v in c.env.items()]
    if requeue:
        lines.append(f"export {REQUEUE_ENV}={REQUEUE_EXIT}   # the work asks this script to requeue the job")
    if c.runtime == "charliecloud":
        lines.append('export USER="${USER:-$(id -un)}"')
    return lines


def outbox_watch(outbox: str) -> list[str]:
    """Script lines that start, in the background, the host-side submitter of work in the image:
    each OUTBOX/NAME.req holds a script's path; the answer is NAME.id (the job id) or NAME.err.
    `$outbox_pid` stops it (outbox_stop)."""
    q = shlex.quote(outbox)
    return [f"# the image has no sbatch: this shell submits what the ranks ask for in {outbox} (export evals)",
            f"export {OUTBOX_ENV}={q}",
            f'mkdir -p "${OUTBOX_ENV}"',
            "( set +e; while sleep 1; do for req in \"$" + OUTBOX_ENV + "\"/*.req; do [ -e \"$req\" ] || continue; "
            'r=${req%.req}; mv "$req" "$r.taken" || continue; '
            'if sbatch --parsable "$(cat "$r.taken")" > "$r.tmp" 2>&1; then mv "$r.tmp" "$r.id"; else mv "$r.tmp" "$r.err"; fi; '
            'rm -f "$r.taken"; done; done ) &',
            "outbox_pid=$!"]


def outbox_stop() -> str:
    return 'kill "$outbox_pid" 2>/dev/null || true'


def step_line(c: ContainerOptions, srun: list[str], command: list[str], workdir: str, always: list[str],
              gpus: bool) -> str:
    """`srun [srun flags] [container flags] [prefix] command`, shell-quoted; without a container,
    `srun [srun flags] command`."""
    flags, prefix = step_prefix(c, workdir, always, gpus) if c.runtime else ([], [])
    return " ".join(shlex.quote(x) if i >= len(srun) else x for i, x in enumerate([*srun, *flags, *prefix, *command]))
