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
