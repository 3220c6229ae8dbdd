"""Weight-sync options, measured: what each costs and whether it serves the published weights.

For each model and dtype, one vLLM server (CPU build here) is started and three syncs are timed,
each to a different perturbed copy of the model (published with `publish_checkpoint`, which also
fingerprints it):
- `vllm`:    vLLM's own in-place `reload_weights` (pause, reload, reset prefix cache, resume);
- `tbhpc`:   the same, then re-packing of the kernel copies it leaves stale (the default);
- `restart`: stop the server, start a fresh one on the checkpoint (the baseline: exact by
             construction; its time is what every other option is compared with).
After each sync the server is checked like the supervisor does (`verify.check_weights`): `digest`
says whether every tensor it holds (parameters and packed kernel copies) equals the published
digest bit for bit, `mean err` is the probe's mean |Δ logprob| against the new weights, `check s`
what both checks cost, `srv digest s` the server's share of it. Publishing (save + digests +
fingerprint) is timed apart, `pub digest s` its digest share; `digest GB/s` is the server's rate
over the bytes it digested (the figure to extrapolate a large model from, README).

Usage: python bench/weight_sync.py [--models tiny,smollm2] [--dtypes float32,bfloat16] [--threads 2]
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from tbhpc.serve.checkpoints import publish_checkpoint
from tbhpc.serve.config import ServeConfig
from tbhpc.serve.fingerprint import Fingerprint, default_tol, distance, served_logprobs
from tbhpc.serve.auth import ensure_token
from tbhpc.serve.server import VLLMServer
from tbhpc.serve.verify import check_weights

from serving_models import add_model_args, model_dirs


def perturbed(model, seed: int, scale: float = 0.05):
    """A copy of `model` with every weight moved by `scale` × its mean magnitude (a large step,
    so a server that misses part of it is visible in the figures)."""
    import copy

    import torch
    out = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in out.parameters():
            p.add_(torch.randn(p.shape, generator=g) * p.abs().mean() * scale)
    return out


def bench_one(console: Console, name: str, model_dir: Path, dtype: str, threads: int, rows: list) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(model_dir)
    base = AutoModelForCausalLM.from_pretrained(model_dir)
    with tempfile.TemporaryDirectory() as run:
        cfg = ServeConfig(model=str(model_dir), device="cpu", dtype=dtype, kv_cache_gb=1, cpu_threads=threads,
                          max_model_len=2048)
        server = VLLMServer(cfg, str(model_dir), Path(run) / "logs" / "vllm.log", token_file=str(ensure_token(run)))
        t0 = time.monotonic()
        server.start().wait_ready()
        start_s = time.monotonic() - t0
        try:
            kernels = server.kernel_report()
            served_logprobs(server.client, cfg.served_model_name, [0, 1, 2, 3])       # first-request set-up
            paths = ", ".join(f"{k}×{n}" for k, n in kernels["paths"].items())
            console.print(f"{name} {kernels['dtype']}: server ready in {start_s:.1f} s, kernels {paths}")
            previous = None
            for step, method in enumerate(("vllm", "tbhpc", "restart"), start=1):
                t0 = time.monotonic()
                pub = publish_checkpoint(run, step, perturbed(base, seed=step), tok)
                publish_s = time.monotonic() - t0
                fp = Fingerprint.from_json(pub.fingerprint)
                t0 = time.monotonic()
                if method == "restart":
                    port = server.port
                    server.stop()
                    server = VLLMServer(cfg, str(pub.path), server.log_path, port=port, token_file=server.token_file).start()
                    server.wait_ready()
                    served_logprobs(server.client, cfg.served_model_name, [0, 1, 2, 3])
                else:
                    server.reload(str(pub.path), pub.version, method)
                sync_s = time.monotonic() - t0
                tol = max(default_tol(fp.dtype), default_tol(kernels["dtype"]))
                want = pub.digests[kernels["dtype"]]
                t0 = time.monotonic()
                verdict = check_weights(server.client, cfg.served_model_name, pub.version, want, fp, tol)
                check_s = time.monotonic() - t0
                moved = distance(previous.logprobs, fp.logprobs)[1] if previous else float("nan")
                gbytes = sum(p.numel() for p in base.parameters()) * (4 if kernels["dtype"] == "float32" else 2) / 1e9
                rows.append((name, kernels["dtype"], paths, method, publish_s, want["digest_s"], sync_s, check_s,
                             verdict.digest.seconds, gbytes / max(verdict.digest.seconds, 1e-9),
                             verdict.probe.mean_err, verdict.digest.equal, verdict.probe.passed, moved))
                console.print(f"  {method}: publish {publish_s:.2f} s, sync {sync_s:.2f} s, {verdict.summary()}")
                previous = fp
        finally:
            server.stop()


def main() -> int:
    ap = argparse.ArgumentParser()
    add_model_args(ap)
    args = ap.parse_args()
    console = Console(width=200)
    with tempfile.TemporaryDirectory() as tmp:
        models = model_dirs(args.models.split(","), Path(tmp), console)
        rows: list = []
        for name, path in models.items():
            for dtype in args.dtypes.split(","):
                bench_one(console, name, path, dtype, args.threads, rows)
    table = Table(title="weight sync: time and exactness per option (same run, same machine)")
    for col in ("model", "dtype", "kernels", "sync", "publish s", "pub digest s", "sync s", "× restart", "check s",
                "srv digest s", "digest GB/s", "check / sync", "digest", "mean err", "probe", "step moved"):
        table.add_column(col, justify="right")
    for group in sorted({(r[0], r[1]) for r in rows}):
        rs = [r for r in rows if (r[0], r[1]) == group]
        restart = next(r[6] for r in rs if r[3] == "restart")
        for (name, dtype, paths, method, publish_s, pub_dig, sync_s, check_s, srv_dig, rate, err, same, ok, moved) in rs:
            table.add_row(name, dtype, paths, method, f"{publish_s:.2f}", f"{pub_dig:.3f}", f"{sync_s:.2f}",
                          f"{sync_s / restart:.3f}", f"{check_s:.3f}", f"{srv_dig:.3f}", f"{rate:.2f}",
                          f"{check_s / sync_s:.2f}", "identical" if same else "[red]DIFFERS", f"{err:.1e}",
                          "pass" if ok else "[red]FAIL", f"{moved:.2f}")
    console.print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
