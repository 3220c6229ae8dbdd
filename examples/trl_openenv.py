"""Train with TRL on the demo pack through OpenEnv: TRL's GRPOTrainer, tbhpc's tasks and checks.

    .venv-openenv/bin/tbhpc openenv-serve demo --port 8000 &
    .venv/bin/python examples/trl_openenv.py --url http://127.0.0.1:8000 --steps 10

Every rollout is one attempt on the server: TRL's tool loop calls the domain's tools and
`submit_message` (the simulated user's reply comes back as the tool's result), and the reward
is the server's database-state verdict (`get_reward` -> `finish`). The demo model's chat template
speaks Qwen3's tool-call format, which TRL is told by hand (`response_template`).
"""
import argparse
import os
import random

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402
from trl.chat_template_utils import qwen3_template  # noqa: E402

from tbhpc.openenv.trl import environment_factories, trl_dataset  # noqa: E402
from tbhpc.tasks.loader import load_pack, resolve_pack  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--url", default="http://127.0.0.1:8000")
ap.add_argument("--model", default="models/demo-pack-warm")
ap.add_argument("--tasks", type=int, default=32, help="train-split tasks of the demo pack to train on")
ap.add_argument("--steps", type=int, default=10)
ap.add_argument("--out", default="runs/trl-openenv")
args = ap.parse_args()

train = [t.id for t in load_pack(resolve_pack("demo")) if t.split == "train"]
rows, tools = trl_dataset(args.url, random.Random(0).sample(train, args.tasks))
tok = AutoTokenizer.from_pretrained(args.model)
tok.response_template = qwen3_template
model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
config = GRPOConfig(output_dir=args.out, per_device_train_batch_size=8, num_generations=8, max_completion_length=256,
                    max_steps=args.steps, learning_rate=1e-4, logging_steps=1, save_strategy="no", report_to="none",
                    use_cpu=True, bf16=False, fp16=False, max_tool_calling_iterations=8, seed=0)
trainer = GRPOTrainer(model=model, args=config, train_dataset=Dataset.from_list(rows), processing_class=tok,
                      environment_factory=environment_factories(args.url, tools))
trainer.train()
for h in trainer.state.log_history:
    rewards = {k.split("/")[1].removeprefix("OpenEnv_"): round(float(v), 3) for k, v in h.items()
               if k.startswith("rewards/") and k.endswith("/mean") and v is not None}
    if rewards:
        print(f"step {h['step']}: reward {float(h['reward']):.3f} ({rewards}), tool calls per rollout "
              f"{float(h['tools/call_frequency']):.2f}, failed {float(h['tools/failure_frequency']):.2f}")
