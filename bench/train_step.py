"""Benchmark: one GRPO update of tbhpc's trainer against TRL's GRPOTrainer doing the same update.

Same model, same batch of variable-length multi-turn episodes (lengths log-uniform over a 16x
range, prompt/observation tokens masked, behaviour logprobs given), same loss (PPO-clip 0.2/0.2,
token mean over the whole batch: TRL's loss_type="dapo", beta 0), AdamW, fp32 on CPU, gradient
checkpointing off on both sides (TRL's default is on: +45% update time measured earlier).
tbhpc: DeepSpeed engine (ZeRO-3, one rank, gloo), episodes packed into passes of at most the
longest episode (packing.effective_budget). TRL: its compute_loss on right-padded micro-batches of
`--trl-rows` rows (its per-device batch), completion tokens = everything after the first prompt,
tool_mask = the loss mask. Each side runs in its own process: peak RSS is per process.

Also prints the step-time split of a real one-step `tbhpc train` run (local generator) on the
tiny warm start: rollout, update, publish, as the trainer records them in train_steps.

    python bench/train_step.py [--models tiny,smollm2]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SIZES = {"tiny": dict(n=16, lo=200, hi=3200), "smollm2": dict(n=8, lo=64, hi=1024)}


def model_dir(name: str, tmp: Path) -> str:
    if name == "smollm2":
        path = REPO / "build" / "models" / "smollm2-135m"
        if not (path / "config.json").exists():
            sys.exit("bench/train_step.py: run `make model-smollm2` first")
        return str(path)
    warm = REPO / "build" / "models" / "tiny-warm"
    if (warm / "config.json").exists():
        return str(warm)
    from tbhpc.policy.tiny import build_tiny_model
    return str(build_tiny_model(tmp / "tiny"))


def batch(name: str, vocab: int, seed: int = 0):
    """Episodes like agentic ones: a prompt, then generated turns (loss) and observations (no loss)."""
    from tbhpc.rollout.buffer import Episode
    rng = np.random.default_rng(seed)
    s = SIZES[name]
    eps, adv = [], []
    for i in range(s["n"]):
        n = int(np.exp(rng.uniform(np.log(s["lo"]), np.log(s["hi"]))))
        mask = np.zeros(n, np.uint8)
        pos = int(n * 0.3)
        while pos < n:
            gen = int(rng.integers(16, 96))
            mask[pos:pos + gen] = 1
            pos += gen + int(rng.integers(16, 128))
        lps = np.where(mask, rng.normal(-2.0, 0.5, n), 0.0)
        eps.append(Episode(rng.integers(0, vocab, n), mask, lps, group=i // 4, reward=float(i % 2)))
        adv.append(float(rng.normal()))
    return eps, adv


def side_ours(path: str, name: str) -> dict:
    import torch
    from tbhpc.train.config import TrainConfig
    from tbhpc.train.engine import DistEnv, Engine
    from tbhpc.train.packing import effective_budget, pack
    cfg = TrainConfig(model=path, pool="-", lr=1e-6, zero_stage=3, torch_threads=torch.get_num_threads())
    eng = Engine(cfg, DistEnv(0, 1, 0, "127.0.0.1", int(os.environ.get("MASTER_PORT", "29533"))))
    eps, adv = batch(name, eng.module.config.vocab_size)
    budget = effective_budget(cfg.microbatch_tokens, [len(e.tokens) for e in eps], "sdpa")
    eng.update(pack(eps[:2], adv[:2], budget))              # warm-up (allocations, kernels)
    t0 = time.perf_counter()
    packs = pack(eps, adv, budget)
    st = eng.update(packs)
    return {"update_s": time.perf_counter() - t0, "passes": len(packs), "tokens_through_model": sum(p.n_tokens for p in packs),
            "loss_tokens": st.loss_tokens, "loss": st.loss}


def side_trl(path: str, name: str, rows: int) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(output_dir=out, loss_type="dapo", beta=0.0, epsilon=0.2, epsilon_high=0.2, learning_rate=1e-6,
                          weight_decay=0.0, max_grad_norm=1.0, per_device_train_batch_size=rows, num_generations=rows,
                          gradient_checkpointing=False, bf16=False, use_cpu=True, report_to=[], logging_steps=10**6)
        trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **_: [0.0] * len(completions), args=args,
                              train_dataset=Dataset.from_dict({"prompt": ["x"] * rows}), processing_class=tok)
    model = trainer.model
    model.train()
    trainer.current_gradient_accumulation_steps = 1
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.0)
    eps, adv = batch(name, model.config.vocab_size)
    total = int(sum(e.loss_mask.sum() for e in eps))

    def micro(chunk):
        starts = [int(np.argmax(e.loss_mask)) for e, _ in chunk]
        plen = max(starts)
        clen = max(len(e.tokens) - s for (e, _), s in zip(chunk, starts))
        b = len(chunk)
        prompt = torch.full((b, plen), tok.pad_token_id or 0, dtype=torch.long)
        pmask = torch.zeros((b, plen), dtype=torch.long)
        comp = torch.full((b, clen), tok.pad_token_id or 0, dtype=torch.long)
        cmask, tmask = torch.zeros((b, clen), dtype=torch.long), torch.zeros((b, clen), dtype=torch.long)
        old = torch.zeros((b, clen))
        for i, ((e, _), s) in enumerate(zip(chunk, starts)):
            prompt[i, plen - s:] = torch.as_tensor(e.tokens[:s], dtype=torch.long)   # TRL left-pads prompts
            pmask[i, plen - s:] = 1
            n = len(e.tokens) - s
            comp[i, :n] = torch.as_tensor(e.tokens[s:], dtype=torch.long)
            cmask[i, :n] = 1
            tmask[i, :n] = torch.as_tensor(e.loss_mask[s:], dtype=torch.long)
            old[i, :n] = torch.as_tensor(e.logprobs[s:])
        return {"prompt_ids": prompt, "prompt_mask": pmask, "completion_ids": comp, "completion_mask": cmask,
                "tool_mask": tmask, "advantages": torch.tensor([a for _, a in chunk]), "old_per_token_logps": old,
                "num_items_in_batch": torch.tensor(float(total))}, b * (plen + clen)

    pairs = list(zip(eps, adv))
    warm, _ = micro(pairs[:2])
    trainer.compute_loss(model, warm).backward()
    opt.zero_grad()
    t0 = time.perf_counter()
    through, loss = 0, 0.0
    for k in range(0, len(pairs), rows):
        inputs, n = micro(pairs[k:k + rows])
        through += n
        out = trainer.compute_loss(model, inputs)
        out.backward()
        loss += float(out.item())
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return {"update_s": time.perf_counter() - t0, "passes": -(-len(pairs) // rows), "tokens_through_model": through,
            "loss_tokens": total, "loss": loss}


def run_side(side: str, name: str, rows: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2"), "MASTER_PORT": str(29533 + os.getpid() % 1000)}
    out = subprocess.run([sys.executable, __file__, "--side", side, "--model", name, "--trl-rows", str(rows)],
                         capture_output=True, text=True, env=env, cwd=REPO)
    if out.returncode != 0:
        sys.exit(f"{side} on {name} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def step_split() -> dict | None:
    warm = REPO / "build" / "models" / "tiny-warm"
    if not (warm / "config.json").exists():
        return None
    with tempfile.TemporaryDirectory() as tmp:
        res = subprocess.run([sys.executable, "-m", "tbhpc.cli", "train", f"{tmp}/run", f"model={warm}",
                              "pool=jobs/pools/smoke.yaml", "generator=local", "steps=1", "group_size=8", "groups_per_step=2",
                              "max_draws=8", "max_tokens=64", "response_budget=256"], cwd=REPO, capture_output=True,
                             text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        if res.returncode != 0:
            return None
        line = (Path(tmp) / "run" / "logs" / "train_steps.jsonl").read_text().splitlines()[-1]
        return json.loads(line)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--side", choices=("ours", "trl"))
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--models", default="tiny,smollm2")
    ap.add_argument("--trl-rows", type=int, default=4)
    a = ap.parse_args()
    if a.side:
        with tempfile.TemporaryDirectory() as tmp:
            path = model_dir(a.model, Path(tmp))
            res = side_ours(path, a.model) if a.side == "ours" else side_trl(path, a.model, a.trl_rows)
        res["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(json.dumps(res))
        return
    print(f"GRPO update, tbhpc (DeepSpeed ZeRO-3, packed) vs TRL GRPOTrainer (padded, {a.trl_rows} rows per pass); "
          f"fp32, CPU, {os.environ.get('OMP_NUM_THREADS', '2')} threads, gradient checkpointing off on both")
    for name in a.models.split(","):
        ours, trl = run_side("ours", name, a.trl_rows), run_side("trl", name, a.trl_rows)
        assert ours["loss_tokens"] == trl["loss_tokens"]
        print(f"  {name:8s} loss tokens {ours['loss_tokens']:>6}  tokens through the model: tbhpc {ours['tokens_through_model']:>6} "
              f"TRL {trl['tokens_through_model']:>6}")
        print(f"  {'':8s} update: tbhpc {ours['update_s']:.2f} s in {ours['passes']} passes, TRL {trl['update_s']:.2f} s in "
              f"{trl['passes']} -> ratio {ours['update_s'] / trl['update_s']:.2f}x (target <= 0.7x); peak RSS tbhpc "
              f"{ours['peak_rss_mib']:.0f} MiB, TRL {trl['peak_rss_mib']:.0f} MiB; loss {ours['loss']:+.5f} vs {trl['loss']:+.5f}")
    split = step_split()
    if split:
        print(f"  one trainer step, tiny warm start, local generator, {split['episodes']} episodes: rollout "
              f"{split['rollout_s']:.1f} s, update {split['update_s']:.1f} s, publish {split['publish_s']:.1f} s, "
              f"step {split['step_s']:.1f} s")


if __name__ == "__main__":
    main()
