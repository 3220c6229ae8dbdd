"""The serving job ends with its run however the trainer's ranks end, on the local Slurm cluster:
the trainer's script (launch/train.py, as `tbhpc submit train` writes it) cancels the serving job
after srun returns, for a raised error, a rank killed by a signal, and a rank aborted as NCCL's
watchdog aborts one (SIGABRT: such a rank never reaches `end_run`), and keeps it when rank 0
requeued the job (the next start resumes against the same server).

The serving job here is a stand-in (`sleep`): what is tested is the trainer job's handling of its
end, and a vLLM start would cost a minute per case. The trainer is `tbhpc train` itself for the
raised error; for the signals it is a launcher (`slurm.python`) that dies by the signal, since a
real rank cannot be made to meet NCCL's watchdog on a CPU.
"""
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import require_slurm
from tbhpc.launch.train import render_train
from tbhpc.slurm_options import SlurmOptions
from tbhpc.train.config import TrainConfig
from tbhpc.train.jobs import requeue_marker

REPO = Path(__file__).resolve().parents[1]

LAUNCHERS = {      # slurm.python: how the rank process ends
    "signal": "#!/bin/sh\nkill -KILL $$\n",
    "watchdog": "#!/bin/sh\nkill -ABRT $$\n",
    "requeued": "#!/bin/sh\ntouch \"$TBHPC_TEST_MARKER\"\nexit 0\n",
}


def _queued(job: str) -> bool:
    return bool(subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True).stdout.strip())


def _sbatch(*args: str) -> str:
    out = subprocess.run(["sbatch", "--parsable", *args], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().split(";")[0]


def _wait_gone(job: str, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while _queued(job):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.3)
    return True


@pytest.mark.parametrize("ending", ["error", "signal", "watchdog", "requeued"])
def test_the_serving_job_ends_with_the_run_however_rank_0_ends(ending, tmp_path):
    require_slurm()
    run = tmp_path / "run"
    (run / "slurm").mkdir(parents=True)
    (run / "logs" / "slurm").mkdir(parents=True)
    serve = _sbatch("--job-name=tbhpc-serve-standin", "--cpus-per-task=1", f"--output={run}/logs/slurm/serve.out",
                    "--time=00:10:00", "--wrap", "sleep 600")
    python = sys.executable
    env_line = ""
    if ending in LAUNCHERS:
        python = str(tmp_path / "launcher")
        Path(python).write_text(LAUNCHERS[ending])
        Path(python).chmod(0o755)
    if ending == "requeued":       # rank 0 said so before `scontrol requeue` (requeue_or_exit)
        env_line = f"export TBHPC_TEST_MARKER={requeue_marker(run, '$SLURM_JOB_ID', '${SLURM_RESTART_COUNT:-0}')}"
    cfg = TrainConfig(model=str(tmp_path / "no-such-model"), pool="-", nodes=1, generator="server",
                      slurm=SlurmOptions(cpus_per_task=1, mem=None, time="00:05:00", python=python))
    config = run / "train.yaml"
    config.write_text(f"model: {tmp_path / 'no-such-model'}\npool: {tmp_path / 'no-such-pool.yaml'}\n")
    script = render_train(str(run), str(config), cfg, str(REPO), serve_job=serve)
    if env_line:
        script = script.replace("rc=0\n", env_line + "\nrc=0\n", 1)
    path = run / "slurm" / "train.sbatch"
    path.write_text(script)
    train = _sbatch(str(path))
    try:
        assert _wait_gone(train, 120), f"the trainer job {train} did not end"
        if ending == "requeued":
            time.sleep(2)
            assert _queued(serve), "the serving job was cancelled though rank 0 had requeued the trainer"
        else:
            assert _wait_gone(serve, 30), f"the serving job outlived a trainer that ended by {ending}"
        log = "\n".join(p.read_text(errors="replace") for p in (run / "logs" / "slurm").glob("tbhpc-train-*.out"))
        if ending == "error":        # tbhpc train itself raised, with its one line
            assert "tbhpc: " in log and "no-such" in log, log[-2000:]
    finally:
        subprocess.run(["scancel", serve, train], capture_output=True)
