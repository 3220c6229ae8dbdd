"""Whole GRPO steps, tbhpc against TRL's GRPOTrainer on the same work: rollouts through one OpenEnv
server (`tbhpc openenv-serve demo`), the update, the next step.

    .venv/bin/python bench/vs_trl.py [--steps 12] [--out runs/vs_trl]

Same model (models/demo-pack-warm, fp32), same 32 train-split tasks of the demo pack, same group
size (8) and groups per step (2), same lr, seed and threads; both generate in their own process
(TRL: transformers' generate over the step's 16 completions at once, inside its tool loop;
tbhpc: `generator=batched`, the episodes in flight decoded together, and for reference
`generator=local`, each episode decoding alone) and both reach the
tools, the simulated user and the database-state verdict through the same served environment
(TRL: `tbhpc.openenv.trl`'s `environment_factory`; tbhpc: `environment=openenv`).

The same number of episodes a step: tbhpc with `max_draws` = groups per step, so a flat group is
not replaced (TRL has no replacement) and both sides generate 16 episodes a step. What the two
loops still do differently, by design: TRL's rollout ends at the first turn without a tool call
(the agent reaches the user only through `submit_message`), tbhpc's at the agent's `finish` or
the response budget, so episodes differ in length; generated tokens per second is reported beside
episodes per second for that reason. TRL's gradient checkpointing is off (tbhpc's is off here
too); its loss is `dapo` (token mean), beta 0, as tbhpc's. Steady state: step 1 (compilation,
first allocations) is left out on both sides. Writes OUT/vs_trl.json and OUT/vs_trl.md.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODEL = REPO / "models" / "demo-pack-warm"


def task_ids(n: int) -> list[str]:
    from tbhpc.tasks.loader import load_pack, resolve_pack
    train = [t.id for t in load_pack(resolve_pack("demo")) if t.split == "train"]
    return sorted(random.Random(0).sample(train, n))


def side_trl(a: argparse.Namespace) -> dict:
    """TRL's GRPOTrainer over the served environment; the time at every optimizer step's end."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen3_template

    from tbhpc.openenv.trl import environment_factories, trl_dataset

    rows, tools = trl_dataset(a.url, task_ids(a.tasks))
    tok = AutoTokenizer.from_pretrained(MODEL)
    tok.response_template = qwen3_template          # the demo model's template speaks Qwen3's tool-call format
    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32)
    ends = []

    class StepTimes(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            ends.append(time.monotonic())

    config = GRPOConfig(output_dir=str(a.out / "trl"), per_device_train_batch_size=a.group_size * a.groups,
                        num_generations=a.group_size, max_completion_length=a.budget, max_steps=a.steps,
                        learning_rate=a.lr, loss_type="dapo", beta=0.0, gradient_checkpointing=False, logging_steps=1,
                        save_strategy="no", report_to="none", use_cpu=True, bf16=False, fp16=False,
                        max_tool_calling_iterations=8, seed=a.seed)
    trainer = GRPOTrainer(model=model, args=config, train_dataset=Dataset.from_list(rows), processing_class=tok,
                          environment_factory=environment_factories(a.url, tools), callbacks=[StepTimes()])
    start = time.monotonic()
    trainer.train()
    logs = [h for h in trainer.state.log_history if "completions/mean_length" in h]
    return {"side": "trl", "start": start, "ends": ends, "episodes": [a.group_size * a.groups] * len(ends),
            "gen_tokens": [float(h["completions/mean_length"]) for h in logs],
            "reward": [float(h["reward"]) for h in logs]}


def side_tbhpc(a: argparse.Namespace, generator: str) -> dict:
    """`tbhpc train` with an in-process generator and `environment=openenv` on the same server."""
    run = a.out / f"tbhpc-{generator}"
    pool = a.out / "pool.yaml"
    pool.write_text("tasks: [" + ", ".join(task_ids(a.tasks)) + "]\n")
    cmd = [sys.executable, "-m", "tbhpc.cli", "train", str(run), f"model={MODEL}", "pack=demo", f"pool={pool}",
           f"generator={generator}", f"episodes_in_flight={a.group_size * a.groups}", "environment=openenv", f"openenv={{url: '{a.url}'}}", f"steps={a.steps}",
           f"group_size={a.group_size}", f"groups_per_step={a.groups}", f"max_draws={a.groups}", "max_tokens=64",
           f"response_budget={a.budget}", f"lr={a.lr}", "zero_stage=0", f"seed={a.seed}", "keep_checkpoints=1",
           f"checkpoint_every={a.steps}"]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS")}
    start = time.monotonic()
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"tbhpc train failed:\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
    rows = [json.loads(x) for x in (run / "logs" / "train_steps.jsonl").read_text().splitlines()]
    return {"side": f"tbhpc-{generator}", "start": start, "step_s": [r["step_s"] for r in rows], "episodes": [r["episodes"] for r in rows],
            "gen_tokens": [r["gen_tokens"] for r in rows], "reward": [r["reward_mean"] for r in rows]}


def steady(res: dict) -> dict:
    """Steps 2..N: seconds per step (median, min-max), steps, episodes and generated tokens per second."""
    if res["side"] == "trl":
        step_s = [b - e for e, b in zip(res["ends"], res["ends"][1:])]
    else:
        step_s = res["step_s"][1:]
    episodes, tokens = res["episodes"][1:], [e * g for e, g in zip(res["episodes"][1:], res["gen_tokens"][1:])]
    total = sum(step_s)
    return {"steps": len(step_s), "step_median": statistics.median(step_s), "step_min": min(step_s),
            "step_max": max(step_s), "steps_per_s": len(step_s) / total, "episodes_per_s": sum(episodes) / total,
            "tokens_per_episode": sum(tokens) / sum(episodes), "gen_tokens_per_s": sum(tokens) / total,
            "reward": statistics.fmean(res["reward"])}


def table(s: dict[str, dict], a: argparse.Namespace, cpu: str) -> str:
    t, loc, r = s["tbhpc-batched"], s["tbhpc-local"], s["trl"]
    lines = [f"*Measured {time.strftime('%Y-%m-%d')} · dev VM: {cpu} · `python bench/vs_trl.py --steps {a.steps}`*", "",
             f"Steady state, steps 2-{a.steps}; {a.groups} groups of {a.group_size} a step; models/demo-pack-warm fp32.", "",
             "| | tbhpc train, batched | TRL GRPOTrainer | tbhpc / TRL | tbhpc train, local |", "|---|---|---|---|---|"]
    rows = [("step (median, min-max)", lambda x: f"{x['step_median']:.2f} s ({x['step_min']:.2f}-{x['step_max']:.2f})", "step_median", True),
            ("steps per second", lambda x: f"{x['steps_per_s']:.3f}", "steps_per_s", False),
            ("episodes per second", lambda x: f"{x['episodes_per_s']:.2f}", "episodes_per_s", False),
            ("generated tokens per episode", lambda x: f"{x['tokens_per_episode']:.0f}", "tokens_per_episode", False),
            ("generated tokens per second", lambda x: f"{x['gen_tokens_per_s']:.0f}", "gen_tokens_per_s", False),
            ("reward per episode", lambda x: f"{x['reward']:.3f}", None, False)]
    for name, fmt, key, _ in rows:
        ratio = f"{t[key] / r[key]:.2f}x" if key else ""
        lines.append(f"| {name} | {fmt(t)} | {fmt(r)} | {ratio} | {fmt(loc)} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--tasks", type=int, default=32)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--groups", type=int, default=2)
    ap.add_argument("--budget", type=int, default=256, help="generated tokens per episode (TRL's max_completion_length)")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("runs/vs_trl"))
    ap.add_argument("--side", choices=("trl",), help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.steps < 3:
        ap.error("--steps must be at least 3 (step 1 is left out; a spread needs two steps)")
    a.out = a.out.resolve()
    if a.side:
        print(json.dumps(side_trl(a)))
        return
    from rich.console import Console

    from tbhpc.openenv.launch import Launched, OpenEnvSpec
    from tbhpc.cpuinfo import cpu_class
    console = Console()
    a.out.mkdir(parents=True, exist_ok=True)
    python = os.environ.get("TBHPC_OPENENV_PYTHON") or str(REPO / ".venv-openenv" / "bin" / "python")
    server = Launched(OpenEnvSpec(launch=f"{python} -m tbhpc.cli openenv-serve demo --max-sessions 32 --port {{port}}"))
    try:
        a.url = server.url
        results = {}
        for generator in ("batched", "local"):
            with console.status(f"tbhpc train, generator={generator} ..."):
                results[f"tbhpc-{generator}"] = side_tbhpc(a, generator)
        with console.status("TRL GRPOTrainer ..."):
            p = subprocess.run([sys.executable, __file__, "--side", "trl", "--url", a.url, "--out", str(a.out),
                                *(f"--{k.replace('_', '-')}={getattr(a, k)}" for k in ("steps", "tasks", "group_size", "groups", "budget", "lr", "seed"))],
                               cwd=REPO, capture_output=True, text=True)
            if p.returncode != 0:
                sys.exit(f"TRL side failed:\n{p.stderr[-3000:]}")
            results["trl"] = json.loads(p.stdout.strip().splitlines()[-1])
    finally:
        server.stop()
    s = {k: steady(v) for k, v in results.items()}
    (a.out / "vs_trl.json").write_text(json.dumps({"raw": results, "steady": s}, indent=1))
    md = table(s, a, cpu_class())
    (a.out / "vs_trl.md").write_text(md)
    console.print(md)


if __name__ == "__main__":
    main()
