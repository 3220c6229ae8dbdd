"""The sbatch text `--dry-run` prints, golden-tested (set TBHPC_UPDATE_GOLDEN=1 to rewrite after a
deliberate change, then review the diff)."""
import os
from pathlib import Path

import pytest

from tbhpc.slurm_options import SlurmOptions
from tbhpc.launch.sbatch import Stage, render_mpi, render_step
from tbhpc.launch.submit import dry_run_text, render_pipeline

GOLDEN = Path(__file__).parent / "golden"
STAGE = Stage(run="/scratch/runs/eval-q38", stage=2, name="eval-q38", workdir="/home/ada/tbhpc")
OPTS = SlurmOptions(partition="batch", account="acct_a", qos="normal", nice=100, time="01:30:00", mem="8G",
                    array_parallelism=16, python="/opt/tbhpc/.venv/bin/python")


def check(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("TBHPC_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), f"{name} changed; review and rerun with TBHPC_UPDATE_GOLDEN=1"


@pytest.mark.parametrize("kind", ["eval", "probe"])
def test_chained_pipeline(kind):
    stage = Stage(STAGE.run.replace("eval", kind), 1, STAGE.name.replace("eval", kind), STAGE.workdir)
    check(f"pipeline_{kind}.txt", dry_run_text(render_pipeline(stage, OPTS, 12, kind)))


def test_merge_step_alone():
    check("merge.sbatch", render_step(STAGE, OPTS, "merge", ["merge", STAGE.run], "4242"))


def test_gpu_array_and_mpi():
    gpu = SlurmOptions(partition="gpu", gres="gpu:1", cpus_per_task=8, mem=None, time="04:00:00", python="/opt/py",
                       extra_sbatch=["--constraint=h200"], nodes=3, ntasks=12)
    check("pipeline_eval_gpu.txt", dry_run_text(render_pipeline(STAGE, gpu, 3, "eval")))
    check("mpi.sbatch", render_mpi(STAGE, gpu))


def test_resubmission_names_only_the_failed_tasks():
    from tbhpc.launch.sbatch import render_array
    text = render_array(STAGE, OPTS, 12, "3,7")
    assert "#SBATCH --array=3,7%16" in text and "--requeue" in text and "--signal=B:USR2@120" in text


def test_task_sizing():
    assert SlurmOptions(attempt_seconds=60, target_task_minutes=10).task_size(5_000) == 10  # 10 min of 1-min episodes
    assert SlurmOptions(attempt_seconds=0.01, target_task_minutes=10).task_size(10_140) == 60_000
    assert SlurmOptions(attempts_per_task=1, max_array_tasks=1000).task_size(10_140) == 11  # never > 1000 tasks


def test_the_reference_training_run():
    """jobs/train-reference.yaml as `tbhpc submit train --dry-run` renders it, with a cluster's NCCL settings."""
    from tbhpc.config import load_config
    from tbhpc.launch.train import render_train_pipeline
    from tbhpc.train.config import TrainConfig
    repo = Path(__file__).resolve().parent.parent
    cfg = load_config(TrainConfig, repo / "jobs" / "train-reference.yaml",
                      ["model=/models/q27", "pool=/runs/probe/pool.yaml", "slurm.python=/opt/tbhpc/.venv/bin/python",
                       "env={NCCL_IB_HCA: 'mlx5_0,mlx5_1', NCCL_SOCKET_IFNAME: ib0}",
                       "serve.slurm={gres: 'gpu:8', cpus_per_task: 32, mem: 512G, time: '48:00:00', "
                       "extra_sbatch: ['--exclusive'], python: /opt/tbhpc/.venv/bin/python}"])
    scripts = render_train_pipeline("/scratch/runs/grpo-27b", cfg, "/home/ada/tbhpc")
    check("train_reference.txt", "".join(f"# ==> {name} <==\n{text}" for name, text in scripts.items()))
    assert "# rollouts: 16 ranks x 9 episodes in flight = 144 (episodes_in_flight 144) against 2 vLLM replicas" \
        in scripts["train.sbatch"]        # one step's 18 x 8 episodes, not 16 ranks x a per-rank figure
    # the published layout: 24 GPUs on 3 nodes, 2 training nodes of 8 and one serving node of 8
    assert "#SBATCH --nodes=2" in scripts["train.sbatch"] and "#SBATCH --ntasks-per-node=8" in scripts["train.sbatch"]
    assert "#SBATCH --nodes=1" in scripts["serve.sbatch"] and "#SBATCH --gres=gpu:8" in scripts["serve.sbatch"]
    assert "#SBATCH --exclusive" in scripts["serve.sbatch"]     # nobody else on the node of vLLM's loopback sockets
    assert "times out after 1,698 s (max_tokens 8,192 at 5 tokens/s + 60 s)" in scripts["train.sbatch"]


CONTAINERS = {
    "pyxis": {"runtime": "pyxis", "image": "/shared/images/tbhpc-cuda.sqsh"},
    "apptainer": {"runtime": "apptainer", "image": "/shared/images/tbhpc-cuda.sif"},
    "charliecloud": {"runtime": "charliecloud", "image": "/shared/images/tbhpc-cuda"},
}


@pytest.mark.parametrize("runtime", sorted(CONTAINERS))
def test_every_script_runs_its_work_in_the_container(runtime):
    """A probe array (with its merge and select), the serving job and a 2-node trainer, each with
    `slurm.container`: the work is one srun step in the image, the script requeues from outside."""
    from tbhpc.config import load_config
    from tbhpc.launch.train import render_train_pipeline
    from tbhpc.slurm_options import ContainerOptions
    from tbhpc.train.config import TrainConfig
    mounts = ["/scratch", "/models:/models" + (":ro" if runtime != "charliecloud" else "")]
    container = {**CONTAINERS[runtime], "mounts": mounts, "env": {"HF_HUB_OFFLINE": "1"},
                 "python": "/opt/tbhpc/.venv/bin/python"}
    opts = SlurmOptions(partition="batch", time="01:30:00", mem="8G", array_parallelism=16,
                        python="/home/ada/tbhpc/.venv/bin/python", container=ContainerOptions(**container))
    stage = Stage("/scratch/runs/probe-q38", 1, "probe-q38", "/home/ada/tbhpc")
    probe = dry_run_text({**render_pipeline(stage, opts, 12, "probe"), "mpi.sbatch": render_mpi(stage, opts)})
    repo = Path(__file__).resolve().parent.parent
    serve_container = {**container, "python": "/opt/tbhpc/.venv/bin/python"}
    cfg = load_config(TrainConfig, repo / "jobs" / "train-reference.yaml",
                      ["model=/models/q27", "pool=/scratch/runs/probe-q38/pool.yaml", "export_eval=jobs/eval.yaml",
                       f"slurm.container={container}",
                       f"serve.slurm={{gres: 'gpu:8', cpus_per_task: 32, mem: 512G, time: '48:00:00', container: {serve_container}}}"])
    train = render_train_pipeline("/scratch/runs/grpo-27b", cfg, "/home/ada/tbhpc")
    check(f"container_{runtime}.txt", probe + "".join(f"# ==> {name} <==\n{text}" for name, text in train.items()))
    array, serve, trainer = render_pipeline(stage, opts, 12, "probe")["array.sbatch"], train["serve.sbatch"], train["train.sbatch"]
    for text in (array, serve, trainer):
        assert "/opt/tbhpc/.venv/bin/python -m tbhpc" in text and "/home/ada/tbhpc/.venv" not in text
    assert "#SBATCH --signal=USR2@120" in array and "B:USR2" not in array      # to the step, where the work is
    assert 'scontrol requeue "${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"' in array and "TBHPC_REQUEUE_EXIT=75" in array
    assert 'then scontrol requeue "$SLURM_JOB_ID"' in trainer and "scancel ${SERVE_JOB_ID}" in trainer
    # the export evals the ranks submit go through the script's watcher, stopped when the ranks end
    assert trainer.index("outbox_pid=$!") < trainer.index("srun --kill-on-bad-exit") < trainer.index('kill "$outbox_pid"')
    assert serve.count("exec srun --ntasks=1 --cpus-per-task=32") == 1
    assert "srun --mpi=pmix --cpus-per-task=1 " in probe and "tbhpc.launch.mpi_worker" in probe
    if runtime == "pyxis":
        assert ("--container-mounts=/scratch:/scratch,/models:/models:ro,/home/ada/tbhpc:/home/ada/tbhpc "
                "--container-workdir=/home/ada/tbhpc --container-env=HF_HUB_OFFLINE") in trainer
    if runtime == "apptainer":
        assert "apptainer exec --nv --bind /scratch:/scratch" in trainer and "apptainer exec --nv" in serve
        assert "apptainer exec --bind" in array                      # CPU probe: no --nv
    if runtime == "charliecloud":
        assert 'export USER="${USER:-$(id -un)}"' in array and " /shared/images/tbhpc-cuda -- " in array
