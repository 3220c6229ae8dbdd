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
                slurm="/usr/bin/sbatch", slurm_job="123")
REF = TrainConfig(model="m", pool="p", nodes=3, gpus_per_node=8)
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
])
def test_each_thing_that_would_stop_the_run_is_one_line(node, needle):
    found = problems(node, REF, SERVE)
    assert len(found) == 1 and needle in found[0] and "\n" not in found[0], found


def test_one_gpu_per_task_is_fine_and_offload_needs_a_compiler():
    assert problems(replace(GPU_NODE, gpus=["H100"]), REF, SERVE) == []
    off = replace(REF, offload_optimizer=True)
    assert problems(GPU_NODE, off, SERVE) == []
    assert "C++ compiler" in problems(replace(GPU_NODE, cxx=""), off, SERVE)[0]


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
