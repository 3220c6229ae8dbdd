"""A probe array inside a container on the local Slurm cluster (charliecloud's ch-run: the one
runtime Debian ships; pyxis and Apptainer are golden-tested in test_sbatch_golden.py).

The image (`make image-ch`, env/container/charliecloud-image.sh) is Debian without Slurm's client;
the locked environment is bound in from the host at its own path. The array tasks must run inside
it (their root is the image's), give the rows the same probe gives outside, and survive Slurm's
time-limit signal: a task in the image cannot reach scontrol, so it exits 75 and the job's script
requeues it (launch/container.py)."""
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import attempt_rows, require_slurm

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parent.parent


def ch_image() -> tuple[Path, Path]:
    """(the image `make test` built (TBHPC_CH_IMAGE), the interpreter prefix the environment's python
    links to), both bindable in it; or skip; with TBHPC_REQUIRE_SLURM (CI) fail."""
    path = os.environ.get("TBHPC_CH_IMAGE", "")
    if not path or not (Path(path) / ".tbhpc-image").is_file():
        if os.environ.get("TBHPC_REQUIRE_SLURM"):
            pytest.fail(f"TBHPC_CH_IMAGE={path!r} is not an image made by `make image-ch`")
        pytest.skip("no charliecloud image (make image-ch; TBHPC_CH_IMAGE=build/images/bookworm)")
    image, base = Path(path), Path(sys.base_prefix).resolve()
    for bound in (REPO, base):                          # ch-run binds onto existing directories (the image is read-only)
        (image / str(bound).lstrip("/")).mkdir(parents=True, exist_ok=True)
    return image, base


def _array_pids(run: Path) -> list[int]:
    out = []
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if proc.name.isdigit() and cmd and cmd[0].endswith(b"python") and b"tbhpc.launch.array_task" in cmd \
                and str(run).encode() in cmd:
            out.append(int(proc.name))
    return out


def _wait(predicate, timeout=120.0):
    end = time.time() + timeout
    while time.time() < end:
        if value := predicate():
            return value
        time.sleep(0.2)
    raise AssertionError("timed out waiting")


def test_a_probe_array_in_a_charliecloud_image_gives_the_rows_it_gives_outside(tmp_path):
    require_slurm()
    image, base = ch_image()
    campaign = ["name=ch", "limit=10", "repeats=2", "policy_opts={skill: 0.7, delay_s: 0.1}"]
    slurm = ("slurm={attempts_per_task: 10, flush_every: 1, poll_seconds: 0.5, "
             f"container: {{runtime: charliecloud, image: {image}, mounts: [{REPO}, {base}]}}}}")
    env = {k: v for k, v in os.environ.items() if k != "USER"}     # the job's script supplies one for ch-run
    inside = tmp_path / "inside"
    proc = subprocess.Popen([sys.executable, "-m", "tbhpc.cli", "probe", "--out", str(inside), "--executor", "slurm",
                             *campaign, slurm], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    pids = _wait(lambda: _array_pids(inside))
    # the worker's root is the image's (its marker file), not the host's
    assert all(Path(f"/proc/{pid}/root/.tbhpc-image").is_file() for pid in pids) and not Path("/.tbhpc-image").exists()
    _wait(lambda: len(list((inside / "shards").glob("*"))) >= 2)
    job = (inside / "slurm" / "stage-001" / "jobs.json").read_text().split('"array": "')[1].split('"')[0]
    # Slurm's signal before the time limit, as `--signal=USR2@N` sends it: to the job's steps
    subprocess.run(["scancel", "--signal=USR2", f"{job}_0"], check=True)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    log = (inside / "logs" / "slurm" / f"tbhpc-ch-{job}_0.out").read_text()
    assert "SIGUSR2 received" in log and f"asking the job's script to requeue {job}_0" in log, log[-2000:]
    assert re.search(r"[1-9]\d* already written", log), log[-2000:]        # the requeued task resumed its chunk
    outside = subprocess.run([sys.executable, "-m", "tbhpc.cli", "probe", "--out", str(tmp_path / "outside"), *campaign],
                             capture_output=True, text=True)
    assert outside.returncode == 0, outside.stderr
    assert attempt_rows(inside) == attempt_rows(tmp_path / "outside") and len(attempt_rows(inside)) == 20


def test_an_image_without_sbatch_submits_through_its_job_scripts_outbox(tmp_path):
    """What a trainer in an image does for its export evals: `tbhpc submit eval` inside the image
    (no sbatch there) hands each script to the watcher its job's script runs on the host, and the
    chained pipeline (array -> merge -> agg) runs as if submitted directly."""
    from tbhpc.launch.container import outbox_watch
    require_slurm()
    image, base = ch_image()
    outbox, run = tmp_path / "outbox", tmp_path / "eval"
    script = tmp_path / "job.sh"                      # the trainer script's lines around its srun step
    script.write_text("set -euo pipefail\n" + "\n".join(outbox_watch(str(outbox))) + "\nwait \"$outbox_pid\"\n")
    watcher = subprocess.Popen(["bash", str(script)], start_new_session=True)
    try:
        _wait(lambda: outbox.is_dir(), timeout=10)
        inside = subprocess.run(
            ["ch-run", f"--bind={REPO}:{REPO}", f"--bind={base}:{base}", f"--cd={REPO}", str(image), "--",
             sys.executable, "-c", "import shutil, sys; from tbhpc.cli.main import main; "
             "assert shutil.which('sbatch') is None; sys.exit(main())",
             "submit", "eval", "--out", str(run), "name=obx", "limit=6", "repeats=2", "slurm={attempts_per_task: 6}"],
            capture_output=True, text=True, timeout=300, env={**os.environ, "USER": "root", "TBHPC_SBATCH_OUTBOX": str(outbox)})
        assert inside.returncode == 0, inside.stderr[-2000:]
        assert "jobs array" in inside.stdout and "merge" in inside.stdout and "agg" in inside.stdout
        assert len(list(outbox.glob("*.id"))) == 3 and not list(outbox.glob("*.err")) and not list(outbox.glob("*.req"))
        logs = run / "logs" / "slurm"
        _wait(lambda: any(p.name.startswith("tbhpc-obx-agg") and "MICRO_AVG" in p.read_text() for p in logs.glob("*.out")))
        assert len(attempt_rows(run)) == 12
    finally:
        os.killpg(watcher.pid, 15)
        watcher.wait(timeout=10)
