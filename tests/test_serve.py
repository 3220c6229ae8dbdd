"""The serve package without a server: the vLLM command line and the Slurm job script (golden), the
endpoint file, the checkpoint-publication protocol, and config errors."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tbhpc.config import load_config
from tbhpc.errors import UserError
from tbhpc.slurm_options import SlurmOptions
from tbhpc.launch.sbatch import render_serve
from tbhpc.serve.checkpoints import latest_ready, mark_ready, publish_checkpoint
from tbhpc.serve.command import vllm_argv, vllm_env
from tbhpc.serve.config import ServeConfig
from tbhpc.serve.endpoint import Endpoint, read_endpoint, remove_endpoint, write_endpoint
from tbhpc.serve.supervisor import version_step

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = dict(run="/shared/runs/grpo-qwen3-8b", config_path="/shared/runs/grpo-qwen3-8b/serve.yaml",
               workdir="/shared/tbhpc", opts=SlurmOptions(partition="gpu", account="acct_a", time="24:00:00", mem="64G",
                                                          cpus_per_task=8, python="/shared/tbhpc/.venv/bin/python"))


def test_serve_job_script_is_the_committed_example():
    """slurm/serve-vllm.sbatch is what `tbhpc serve RUN --executor slurm --dry-run` prints for
    this example (TBHPC_UPDATE_GOLDEN=1 rewrites it after a deliberate change)."""
    text = render_serve(EXAMPLE["run"], EXAMPLE["config_path"], EXAMPLE["opts"], EXAMPLE["workdir"], gpus=2)
    path = REPO / "slurm" / "serve-vllm.sbatch"
    if os.environ.get("TBHPC_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text()
    assert "#SBATCH --gres=gpu:2" in text and text.rstrip().splitlines()[-1].startswith("exec ")


def test_vllm_command_cpu_and_gpu():
    cpu = ServeConfig(model="/m", device="cpu", tool_call_parser="hermes", kv_cache_gb=3, cpu_threads=2)
    argv = vllm_argv(cpu, "/m", 8123)
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert {"--enable-scale-out", "--no-enable-chunked-prefill", "--enable-auto-tool-choice"} <= set(argv)
    assert argv[argv.index("--port") + 1] == "8123" and "--gpu-memory-utilization" not in argv
    env = vllm_env(cpu, {"OMP_NUM_THREADS": "1", "PYTHONPATH": "/x"}, "/run/server.token")
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "3" and env["OMP_NUM_THREADS"] == "2" and env["VLLM_SERVER_DEV_MODE"] == "1"
    assert env["PYTHONPATH"].endswith(":/x") and Path(env["PYTHONPATH"].split(":")[0], "tbhpc_vllm_ext.py").exists()
    # the token's file, never the token; the token check is the last middleware added (the first to run)
    assert env["TBHPC_TOKEN_FILE"] == "/run/server.token"
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--middleware"][-1] == "tbhpc_auth.RequireRunToken"
    assert Path(env["PYTHONPATH"].split(":")[0], "tbhpc_auth.py").exists()
    assert "OMP_NUM_THREADS" not in vllm_env(ServeConfig(model="/m", device="cpu"), {"OMP_NUM_THREADS": "1"}, "t")
    assert vllm_env(ServeConfig(model="/m", device="cpu"), {"SLURM_CPUS_PER_TASK": "6"}, "t")["OMP_NUM_THREADS"] == "6"
    gpu = vllm_argv(ServeConfig(model="/m", device="cuda", tensor_parallel_size=4, reasoning_parser="qwen3"), "/m", 1)
    assert gpu[gpu.index("--tensor-parallel-size") + 1] == "4" and "--gpu-memory-utilization" in gpu
    assert "--reasoning-parser" in gpu and "--no-enable-chunked-prefill" not in gpu


def test_a_lora_server_serves_the_base_as_name_base_and_takes_adapters_up_to_its_rank():
    lora = ServeConfig(model="/m", device="cpu", lora_rank=4)
    argv, plain = vllm_argv(lora, "/m", 1), vllm_argv(ServeConfig(model="/m", device="cpu"), "/m", 1)
    assert argv[argv.index("--served-model-name") + 1] == "policy-base" == lora.base_model_name
    assert argv[argv.index("--max-lora-rank") + 1] == "8" and {"--enable-lora", "--max-loras"} <= set(argv)
    assert plain[plain.index("--served-model-name") + 1] == "policy" and "--enable-lora" not in plain
    assert vllm_env(lora, {}, "t")["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in vllm_env(ServeConfig(model="/m", device="cpu"), {}, "t")
    from tbhpc.serve.adapter import vllm_max_rank
    assert [vllm_max_rank(r) for r in (1, 2, 16, 17, 512)] == [1, 8, 16, 32, 512]
    for bad, message in [({"lora_rank": 600}, "field 'lora_rank' must be within 0..512"),
                         ({"lora_rank": 8, "sync_mode": "restart"}, "field 'sync_mode' must be reload with lora_rank")]:
        with pytest.raises(UserError, match=message):
            ServeConfig(model="/m", **bad).validate()


def test_endpoint_file_round_trip(tmp_path):
    ep = Endpoint("node7", 8100, "policy", "step-000004", model_path="/ckpt", pid=12, job_id="99")
    write_endpoint(tmp_path, ep)
    back = read_endpoint(tmp_path / "endpoint.json")
    assert back == ep and back.openai_url == "http://node7:8100/v1"
    assert not list(tmp_path.glob(".tmp-*"))
    remove_endpoint(tmp_path)
    with pytest.raises(UserError, match="no endpoint file"):
        read_endpoint(tmp_path)
    (tmp_path / "endpoint.json").write_text("{not json")
    with pytest.raises(UserError, match="endpoint.json: not a valid endpoint file"):
        read_endpoint(tmp_path)


def test_checkpoint_publication(tmp_path, tiny_dir):
    from transformers import AutoModelForCausalLM
    assert latest_ready(tmp_path) is None
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    p2 = publish_checkpoint(tmp_path, 2, model)
    assert (p2.path / "model.safetensors").exists() and p2.version == "step-000002"
    model.save_pretrained(tmp_path / "checkpoints" / "step-000009")  # written but not marked: invisible
    (tmp_path / "checkpoints" / "step-000010.ready").write_text("{")  # half-written marker: skipped
    assert latest_ready(tmp_path).step == 2
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="empty: cannot load the checkpoint to fingerprint it"):
        mark_ready(tmp_path, 11, tmp_path / "empty")                    # nothing to fingerprint: no marker
    mark_ready(tmp_path, 9, tmp_path / "checkpoints" / "step-000009")
    assert latest_ready(tmp_path).step == 9 and not list((tmp_path / "checkpoints").glob(".tmp-*"))
    assert version_step("step-000009") == 9 and version_step("base") == 0


def test_serve_config_errors_name_the_field(tmp_path):
    cfg = tmp_path / "serve.yaml"
    cfg.write_text("model: /m\nslurm:\n  cpus: 4\n")
    with pytest.raises(UserError, match=r"serve.yaml \(slurm.cpus\): unknown field 'cpus'"):
        load_config(ServeConfig, cfg)
    with pytest.raises(UserError, match="field 'sync_mode' must be reload or restart"):
        load_config(ServeConfig, None, ["model=/m", "sync_mode=nccl"]).validate()
    with pytest.raises(UserError, match="field 'model' is required"):
        ServeConfig().validate()
    ok = load_config(ServeConfig, REPO / "jobs" / "serve.yaml", ["model=/m"])
    assert isinstance(ok.slurm, SlurmOptions) and ok.slurm.cpus_per_task == 8


def test_serve_cli_dry_runs(capsys):
    from tbhpc.cli import main
    assert main(["serve", "/tmp/r", "--dry-run", "model=/m", "device=cpu", "port=8200"]) == 0
    out = capsys.readouterr().out
    assert "VLLM_CPU_KVCACHE_SPACE=2" in out and "--port 8200" in out
    assert main(["serve", "/tmp/r", "--executor", "slurm", "--dry-run", "model=/m", "device=cuda"]) == 0
    assert "#SBATCH --gres=gpu:1" in capsys.readouterr().out
    assert main(["serve", "/tmp/r", "--dry-run"]) == 2      # no model: one-line error, exit 2
    assert "field 'model' is required" in capsys.readouterr().err


def test_the_vllm_build_is_read_and_a_device_it_cannot_run_on_is_refused(tmp_path):
    """`device: cuda` never starts a CPU vLLM (env/setup-vllm.sh records its build; an environment
    made otherwise is read from its packages), and `auto` is the build's device."""
    from tbhpc.serve.server import vllm_build
    from tbhpc.serve.supervisor import resolve_device
    fake = tmp_path / "venv"
    (fake / "bin").mkdir(parents=True)
    (fake / "bin" / "python").write_text("")
    (fake / ".build").write_text("cpu\n")
    assert vllm_build(str(fake / "bin" / "python"))[0] == "cpu"
    assert vllm_build(sys.executable) == ("", vllm_build(sys.executable)[1])      # the trainer's env: no vLLM
    with pytest.raises(UserError) as err:
        resolve_device(ServeConfig(model="/m", device="cuda", python=str(fake / "bin" / "python")))
    assert "field 'device' is cuda" in str(err.value) and "cpu build" in str(err.value)
    assert "VLLM_BUILD=cuda make env-vllm" in str(err.value) and "\n" not in str(err.value)
    assert resolve_device(ServeConfig(model="/m", device="auto", python=str(fake / "bin" / "python"))).device == "cpu"
    (fake / ".build").write_text("cuda\n")
    with pytest.raises(UserError, match="field 'device' is cpu but .* the cuda build"):
        resolve_device(ServeConfig(model="/m", device="cpu", python=str(fake / "bin" / "python")))
    vllm_python = os.environ.get("TBHPC_VLLM_PYTHON")
    if vllm_python and Path(vllm_python).exists():          # the real serving environment of this machine
        build, what = vllm_build(vllm_python)
        assert build == "cpu", what


def test_make_keeps_the_vllm_build_the_environment_holds(tmp_path):
    """`make train` / `make test` after `make env-vllm VLLM_BUILD=cuda` must not replace the GPU build
    with the CPU one (env/setup-vllm.sh replaces a build that differs): unset, VLLM_BUILD is the
    build .venv-vllm records; cpu where there is none; an explicit VLLM_BUILD wins."""
    repo = Path(__file__).resolve().parents[1]
    venv = tmp_path / "venv-vllm"

    def planned(*args: str) -> str:
        out = subprocess.run(["make", "-n", "env-vllm", f"VLLM_VENV={venv}", *args], cwd=repo,
                             capture_output=True, text=True, check=True).stdout
        return next(line for line in out.splitlines() if "setup-vllm.sh" in line)

    assert "VLLM_BUILD=cpu " in planned()
    venv.mkdir()
    (venv / ".build").write_text("cuda\n")
    assert "VLLM_BUILD=cuda " in planned()
    assert "VLLM_BUILD=cpu " in planned("VLLM_BUILD=cpu")
