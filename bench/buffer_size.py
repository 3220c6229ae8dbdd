"""Rollout buffer size: bytes per token of an HDF5 step file (gzip, lzf) against the raw arrays
(int32 token + uint8 mask + float32 logprob = 9 bytes per token) measured in the same run.

Synthetic agentic episodes: a long shared system prompt and tool schemas (loss mask 0), tool and
user observations (mask 0), and generated turns (mask 1, real-looking negative logprobs); token
ids drawn Zipf-like from a 150k vocabulary, as a tokenizer's output is.

Usage: python bench/buffer_size.py [--episodes 144] [--tokens 20000]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from tbhpc.rollout.buffer import Episode, iter_microbatches, write_step


def synthetic(n: int, tokens: int, seed: int = 0) -> list[Episode]:
    rng = np.random.default_rng(seed)
    prompt = np.minimum(rng.zipf(1.3, 3000), 150_000) - 1  # shared per step, like the system prompt + tools
    eps = []
    for i in range(n):
        parts, masks = [prompt], [np.zeros(len(prompt), np.uint8)]
        while sum(len(p) for p in parts) < tokens * rng.uniform(0.3, 1.0):
            gen = np.minimum(rng.zipf(1.3, int(rng.integers(50, 800))), 150_000) - 1
            obs = np.minimum(rng.zipf(1.3, int(rng.integers(20, 600))), 150_000) - 1
            parts += [gen, obs]
            masks += [np.ones(len(gen), np.uint8), np.zeros(len(obs), np.uint8)]
        toks, mask = np.concatenate(parts), np.concatenate(masks)
        lp = np.where(mask == 1, -rng.exponential(0.4, len(toks)), 0.0)
        eps.append(Episode(toks, mask, lp, group=i // 8, reward=float(rng.random() < 0.5), task_id=f"t{i // 8}",
                           attempt_key=f"c/t{i // 8}/{i % 8}/p", finish_reason="done"))
    return eps


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=144, help="18 groups x 8, the published step size")
    ap.add_argument("--tokens", type=int, default=20_000, help="max tokens per episode")
    args = ap.parse_args()
    eps = synthetic(args.episodes, args.tokens)
    total = sum(len(e.tokens) for e in eps)
    table = Table(title=f"one step: {args.episodes} episodes, {total:,} tokens")
    for col in ("format", "bytes/token", "vs raw", "write s", "read all micro-batches s"):
        table.add_column(col, justify="right")
    table.add_row("raw arrays (baseline)", "9.00", "1.00x", "-", "-")
    with tempfile.TemporaryDirectory() as d:
        for i, comp in enumerate(("gzip", "lzf")):
            t0 = time.perf_counter()
            path = write_step(Path(d), i, eps, compression=comp)
            write_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            n = sum(mb.attention_mask.sum() for mb in iter_microbatches(path, max_tokens=32_768))
            read_s = time.perf_counter() - t0
            assert n == total
            bpt = path.stat().st_size / total
            table.add_row(f"HDF5 {comp}", f"{bpt:.2f}", f"{9 / bpt:.2f}x smaller", f"{write_s:.2f}", f"{read_s:.2f}")
    Console().print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
