"""`tbhpc doctor`: the node as it is (probe), and one line per thing that would stop a config
(problems, pure: tested on nodes described, not only on this one)."""
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from tbhpc.doctor import Node, problems, probe, render
from tbhpc.serve.config import ServeConfig
from tbhpc.train.config import TrainConfig

REPO = Path(__file__).resolve().parents[1]
GPU_NODE = Node(python="3.12", torch="2.11.0", torch_cuda="13.0", gpus=["NVIDIA H100 80GB HBM3"] * 8, nccl="2.27.7",
                deepspeed="0.19.8", transformers="5.19.0", flash_attn=True, nvcc="/usr/local/cuda/bin/nvcc",
                cxx="/usr/bin/g++", vllm_python="/opt/vllm/bin/python", vllm_build="cuda", vllm_what="vllm 0.32.0",
                slurm="/usr/bin/sbatch", slurm_job="123", nccl_wheel="2.27.7", vllm_nccl="2.27.7",
                ninja="/usr/bin/ninja", python_h=True, cuda_visible="0,1,2,3,4,5,6,7", local_id=3, local_world=8,
                task_cpus=4, job_cpus_per_task=4)
REF = TrainConfig(model="m", pool="p", nodes=3, gpus_per_node=8, sync_transport="broadcast")
SERVE = ServeConfig(model="m", device="cuda")


def test_a_ready_gpu_node_has_nothing_to_report():
    assert problems(GPU_NODE, REF, SERVE) == []
    assert "nothing here would stop the config" in render(GPU_NODE, [])


@pytest.mark.parametrize("node, needle", [
    (replace(GPU_NODE, torch_cuda=""), "CPU build"),                        # torch without CUDA
    (replace(GPU_NODE, gpus=[]), "sees no GPU"),                             # a login node
    (replace(GPU_NODE, gpus=["H100"] * 4), "sees 4 GPUs"),                  # a binding no rank can use
    (replace(GPU_NODE, vllm_build="cpu"), "VLLM_BUILD=cuda"),               # the CPU vLLM built on a login node
    (replace(GPU_NODE, vllm_build="", vllm_what="no vLLM"), "make env-vllm"),
    (replace(GPU_NODE, deepspeed=""), "DeepSpeed"),
    # sixteen tasks on a node of eight GPUs, each shown all eight: task 12 has none of its own
    (replace(GPU_NODE, local_id=12, local_world=16), "local rank 12"),
    (replace(GPU_NODE, vllm_nccl="2.26.2"), "NCCL 2.26.2"),                # the broadcast's group would be refused
    (replace(GPU_NODE, flash_attn=False, flash_attn_error="ImportError: undefined symbol"), "does not import"),
    (replace(GPU_NODE, task_cpus=1), "srun does not inherit --cpus-per-task"),
])
def test_each_thing_that_would_stop_the_run_is_one_line(node, needle):
    found = problems(node, REF, SERVE)
    assert len(found) == 1 and needle in found[0] and "\n" not in found[0], found


def test_one_gpu_per_task_is_fine_and_offload_needs_a_compiler():
    one = replace(GPU_NODE, gpus=["H100"], cuda_visible="3")
    assert problems(one, REF, SERVE) == []
    assert "drives cuda:0, DeepSpeed's LOCAL_RANK=0" in render(one, [])
    off = replace(REF, offload_optimizer=True)
    assert problems(GPU_NODE, off, SERVE) == []
    assert "C++ compiler" in problems(replace(GPU_NODE, cxx=""), off, SERVE)[0]
    assert "ninja, Python's headers" in problems(replace(GPU_NODE, ninja="", python_h=False), off, SERVE)[0]


def test_nccl_versions_matter_only_to_a_broadcast():
    mixed = replace(GPU_NODE, vllm_nccl="2.26.2")
    assert problems(mixed, replace(REF, sync_transport="files"), SERVE) == []
    assert problems(replace(mixed, vllm_nccl=""), REF, SERVE) == []       # a system NCCL: nothing to compare


def test_the_command_under_a_fake_gpu_node_prints_a_line_per_problem(tmp_path):
    """A fake GPU node (what a test can set: the task's Slurm place and CUDA_VISIBLE_DEVICES, the node's
    GPUs laid over the probe, a CUDA vLLM environment whose NCCL wheel differs from the trainer's)."""
    import json
    import os
    venv = tmp_path / "vllm-env"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    (venv / ".build").write_text("cuda\n")
    (venv / "lib" / "python3.12" / "site-packages" / "nvidia_nccl_cu12-2.26.2.dist-info").mkdir(parents=True)
    fake = {"torch_cuda": "12.8", "gpus": ["NVIDIA H100 80GB HBM3"] * 8, "nccl": "2.27.7", "flash_attn": False,
            "flash_attn_error": "ImportError: flash_attn_2_cuda.so: undefined symbol"}
    env = {**os.environ, "TBHPC_DOCTOR_FAKE_NODE": json.dumps(fake), "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7",
           "SLURM_LOCALID": "12", "SLURM_NTASKS_PER_NODE": "16"}
    out = subprocess.run([sys.executable, "-m", "tbhpc.cli", "doctor", "jobs/train-reference.yaml",
                          "model=jobs/models/qwen3-27b-class", f"serve={{python: {venv / 'bin' / 'python'}}}"],
                         capture_output=True, text=True, cwd=REPO, timeout=120, env=env)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 1 and all(ln.startswith("tbhpc: doctor: ") and len(ln) < 400 for ln in lines), out.stderr
    for needle in ("local rank 12", "NCCL 2.27.7) and vLLM (NCCL 2.26.2", "flash-attn is installed but does not import"):
        assert sum(needle in ln for ln in lines) == 1, (needle, lines)
    assert "NCCL 2.26.2" in out.stdout and "local task 12 of 16, sees 8 GPU(s): none it can use" in out.stdout


def test_this_node_as_probed():
    n = probe()
    assert n.torch and n.deepspeed and n.transformers and n.python == sys.version.split()[0]
    assert isinstance(n.deepspeed_ops, list)


def test_the_command_exits_1_with_a_line_per_problem_and_0_when_none():
    ok = subprocess.run([sys.executable, "-m", "tbhpc.cli", "doctor"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert ok.returncode == 0 and "tbhpc doctor: this node" in ok.stdout and ok.stderr == ""
    cpu_torch = "+cpu" in probe().torch
    bad = subprocess.run([sys.executable, "-m", "tbhpc.cli", "doctor", "jobs/train-reference.yaml",
                          "model=jobs/models/qwen3-27b-class"], capture_output=True, text=True, cwd=REPO, timeout=120)
    if cpu_torch:           # this machine: a CPU torch, and (with make test) a CPU vLLM
        assert bad.returncode == 1
        lines = bad.stderr.strip().splitlines()
        assert lines and all(ln.startswith("tbhpc: doctor: ") for ln in lines)
        assert any("gpus_per_node is 8" in ln for ln in lines)


def test_the_container_runtime_and_image_a_config_names_are_checked(tmp_path):
    """Each job's `slurm.container`: its runtime on the node (pyxis as srun's flag), its image there."""
    from tbhpc.doctor import container_runtimes
    from tbhpc.slurm_options import ContainerOptions, SlurmOptions
    sif = tmp_path / "tbhpc.sif"
    sif.write_bytes(b"")
    cfg = replace(REF, slurm=SlurmOptions(container=ContainerOptions(runtime="apptainer", image=str(sif))))
    serve = replace(SERVE, slurm=SlurmOptions(container=ContainerOptions(runtime="pyxis", image="nvcr.io#nvidia/pytorch:25.01-py3")))
    assert [p for p in problems(GPU_NODE, cfg, serve) if "container" in p] == [
        "the trainer job: slurm.container.runtime is apptainer but neither apptainer nor singularity is on PATH",
        "the serving job: slurm.container.runtime is pyxis but srun --help shows no --container-image (the pyxis plugin "
        "is not loaded)"]
    node = replace(GPU_NODE, containers={"pyxis": "srun --container-image", "apptainer": "apptainer 1.4.1"})
    assert problems(node, cfg, serve) == []                   # a registry image is pyxis's to pull
    sif.unlink()
    assert problems(node, cfg, serve) == [f"the trainer job: slurm.container.image {sif} does not exist on this node"]
    assert "containers    pyxis (srun --container-image), apptainer (apptainer 1.4.1)" in render(node, [])
    # this node as probed: charliecloud's ch-run where `make test` installed it (make image-ch)
    import shutil
    assert ("charliecloud" in container_runtimes()) == bool(shutil.which("ch-run"))
