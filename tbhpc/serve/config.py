"""What a policy server runs: model, parallelism, parsers, where vLLM lives, and how weight syncs
are applied. One dataclass, loaded from YAML (jobs/serve.yaml) with key=value overrides."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from tbhpc.config import load_config
from tbhpc.slurm_options import SlurmOptions

REPO = Path(__file__).resolve().parents[2]


def default_vllm_python() -> str:
    """The serving environment's interpreter: $TBHPC_VLLM_PYTHON, else the project's .venv-vllm."""
    return os.environ.get("TBHPC_VLLM_PYTHON") or str(REPO / ".venv-vllm" / "bin" / "python")


# the dtypes vLLM's --dtype accepts
DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")


@dataclass
class ServeConfig:
    model: str = ""                      # HF directory (or a checkpoint dir written by the trainer)
    served_model_name: str = "policy"    # the name clients ask for (the base is NAME-base under LoRA)
    host: str = "127.0.0.1"              # bind address; Slurm jobs bind 0.0.0.0 and publish the node name
    port: int = 0                        # 0: pick a free port
    device: str = "auto"                 # auto | cpu | cuda (auto: cuda when the vLLM env is the GPU build)
    dtype: str = "auto"                  # vLLM's --dtype
    max_model_len: int = 8192            # vLLM's --max-model-len (0: the model's)
    tensor_parallel_size: int = 1        # GPUs per replica
    data_parallel_size: int = 1          # replicas
    gpu_memory_utilization: float = 0.85  # vLLM's share of each GPU
    kv_cache_gb: int = 2                 # CPU only: VLLM_CPU_KVCACHE_SPACE
    cpu_threads: int = 0                 # CPU only: OMP threads for the engine (0: vLLM decides)
    reasoning_parser: str = ""           # e.g. qwen3
    tool_call_parser: str = ""           # e.g. hermes; enables auto tool choice
    logprobs_mode: str = "raw_logprobs"  # behaviour logprobs as the model computes them (before sampling filters)
    enforce_eager: bool = False          # no CUDA graphs (faster start, slower decode)
    extra_args: list[str] = field(default_factory=list)  # more vLLM arguments, as they are
    python: str = field(default_factory=default_vllm_python)  # the Python of the serving environment (.venv-vllm)
    ready_timeout_s: float = 900.0       # how long vLLM may take to answer its first request
    # weight sync: "reload" swaps weights inside the running server; "restart" stops it and starts
    # a new one on the checkpoint (exact by construction, a full start's time).
    sync_mode: str = "reload"
    # how a reload loads: "tbhpc" = vLLM's reload_weights, then the CPU kernel copies it leaves
    # stale are re-packed (exact on every path, see serve/vllm_ext/tbhpc_vllm_worker.py);
    # "vllm" = vLLM's reload_weights alone (inexact on CPUs whose kernels pack weights; kept
    # to measure against). Either way the check below catches what is not exact.
    reload_method: str = "tbhpc"
    verify: bool = True                  # check each sync (exact weight digests + fingerprint probe) before announcing it
    verify_tol: float = 0.0              # probe's mean |Δ logprob| allowed; 0: by dtype (serve/fingerprint.py TOLERANCE)
    # a reload that fails its check: "restart" a fresh server on the checkpoint and check that
    # (exact unless the files are damaged), or "refuse" it at once (a large model's restart costs minutes)
    on_mismatch: str = "restart"
    pause_mode: str = "wait"             # in-flight requests during a reload: wait | keep | abort
    # LoRA (a LoRA run's server): > 0 serves the base as `NAME-base` and the run's adapter, up to this
    # rank, as NAME; each sync loads the step's adapter in place (serve/adapter.py). 0: no LoRA.
    lora_rank: int = 0
    poll_s: float = 1.0                  # how often the supervisor looks for a new checkpoint
    slurm: SlurmOptions = field(default_factory=lambda: SlurmOptions(time="24:00:00", mem="16G", cpus_per_task=4))  # the serving job's Slurm options

    @property
    def base_model_name(self) -> str:
        """The name the base model answers to: the served name itself, or NAME-base under LoRA."""
        return f"{self.served_model_name}-base" if self.lora_rank else self.served_model_name

    def validate(self, source: str = "serve config") -> None:
        from tbhpc.errors import UserError
        if not self.model:
            raise UserError(f"{source}: field 'model' is required (an HF model directory)")
        # `model` is not checked for existence here: a serving job may read it from a node-local
        # disk the submitting host does not see (the server says so itself when it starts)
        if self.sync_mode not in ("reload", "restart"):
            raise UserError(f"{source}: field 'sync_mode' must be reload or restart, got {self.sync_mode!r}")
        if self.reload_method not in ("tbhpc", "vllm"):
            raise UserError(f"{source}: field 'reload_method' must be tbhpc or vllm, got {self.reload_method!r}")
        if self.on_mismatch not in ("restart", "refuse"):
            raise UserError(f"{source}: field 'on_mismatch' must be restart or refuse, got {self.on_mismatch!r}")
        if self.verify_tol < 0:
            raise UserError(f"{source}: field 'verify_tol' must be >= 0, got {self.verify_tol!r}")
        if self.pause_mode not in ("wait", "keep", "abort"):
            raise UserError(f"{source}: field 'pause_mode' must be wait, keep or abort, got {self.pause_mode!r}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise UserError(f"{source}: field 'device' must be auto, cpu or cuda, got {self.device!r}")
        if self.dtype not in DTYPES:
            raise UserError(f"{source}: field 'dtype' must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if not 0 <= self.port <= 65535:
            raise UserError(f"{source}: field 'port' must be within 0..65535 (0: a free port), got {self.port}")
        for name in ("tensor_parallel_size", "data_parallel_size", "max_model_len", "kv_cache_gb"):
            if getattr(self, name) < 1:
                raise UserError(f"{source}: field {name!r} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.lora_rank <= 512:
            raise UserError(f"{source}: field 'lora_rank' must be within 0..512 (0: no LoRA), got {self.lora_rank}")
        if self.lora_rank and self.sync_mode != "reload":
            raise UserError(f"{source}: field 'sync_mode' must be reload with lora_rank > 0 (adapters load in place)")
        if self.cpu_threads < 0:
            raise UserError(f"{source}: field 'cpu_threads' must be >= 0 (0: vLLM decides), got {self.cpu_threads}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise UserError(f"{source}: field 'gpu_memory_utilization' must be within (0, 1], got {self.gpu_memory_utilization}")
        for name in ("ready_timeout_s", "poll_s"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) > 0):
                raise UserError(f"{source}: field {name!r} must be a positive number of seconds, got {getattr(self, name)}")
        if not math.isfinite(self.verify_tol):
            raise UserError(f"{source}: field 'verify_tol' must be finite, got {self.verify_tol}")


def load_serve_config(path: Path | str | None, overrides: list[str] | tuple = ()) -> ServeConfig:
    """The one way a serve config is read (`tbhpc serve`): the YAML file < `key=value` overrides, checked."""
    cfg = load_config(ServeConfig, path, list(overrides))
    cfg.validate(str(path or "serve config"))
    return cfg
