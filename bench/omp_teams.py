"""Benchmark: a GRPO-sized forward/backward in the main thread while a second thread that has run
torch ops (the trainer's in-process generator) sits idle, with libgomp's default wait policy and
with the one `tbhpc train` sets (tbhpc/openmp.py).

Each setting runs in its own process (libgomp reads its environment once, at load). In each, the
same 48 passes of 150-600 tokens through the tiny Qwen3 model: first alone, then with the idle
second thread alive. Printed: seconds per round (median of 3) and the ratios against the process's
own "alone" figure. Expected on 2 cores: default ~1.5x slower with the idle thread; the spin policy
~1.0-1.1x (tbhpc/openmp.py explains why).

    OMP_NUM_THREADS=2 python bench/omp_teams.py
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SETTINGS = {"libgomp default": {}, "tbhpc train (spin policy)": {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "300000"}}


def child(model_dir: str) -> None:
    import queue
    import threading
    import time

    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    rng = np.random.default_rng(0)
    lengths = [int(np.exp(rng.uniform(np.log(150), np.log(600)))) for _ in range(48)]
    batches = [torch.from_numpy(rng.integers(0, model.config.vocab_size, n))[None] for n in lengths]

    def one_round() -> float:
        t = time.monotonic()
        for ids in batches:
            model(input_ids=ids, use_cache=False).logits.float().logsumexp(-1).mean().backward()
        opt.step()
        opt.zero_grad()
        return time.monotonic() - t

    def rounds() -> float:
        return statistics.median(one_round() for _ in range(3))

    one_round()                                   # warm-up: kernels chosen, allocator primed
    alone = rounds()
    wake = queue.Queue()

    def idle_torch_thread() -> None:              # what the batched generator's thread does between steps
        a = torch.randn(256, 256)
        for _ in range(20):
            a = torch.tanh(a @ a)
        wake.get()

    t = threading.Thread(target=idle_torch_thread, daemon=True)
    t.start()
    time.sleep(0.5)
    beside = rounds()
    wake.put(None)
    t.join()
    print(json.dumps({"alone": alone, "beside": beside, "threads": torch.get_num_threads()}))


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        return child(sys.argv[2])
    from rich.console import Console
    from rich.table import Table

    from tbhpc.policy.tiny import build_tiny_model
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(build_tiny_model(Path(tmp) / "tiny"))
        rows = {}
        for name, extra in SETTINGS.items():
            env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
            env.update(extra)
            env.setdefault("OMP_NUM_THREADS", "2")
            out = subprocess.run([sys.executable, __file__, "--child", model_dir], env=env, capture_output=True,
                                 text=True, check=True)
            rows[name] = json.loads(out.stdout.strip().splitlines()[-1])
    base = rows["libgomp default"]["alone"]
    table = Table(title=f"48 passes of 150-600 tokens, forward+backward, {rows['libgomp default']['threads']} torch threads")
    for col in ("setting", "alone s", "idle torch thread beside s", "beside / alone", "vs default alone"):
        table.add_column(col)
    for name, r in rows.items():
        table.add_row(name, f"{r['alone']:.2f}", f"{r['beside']:.2f}", f"{r['beside'] / r['alone']:.2f}x",
                      f"{r['beside'] / base:.2f}x")
    Console().print(table)


if __name__ == "__main__":
    main()
