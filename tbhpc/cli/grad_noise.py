"""`tbhpc grad-noise RUN`: signal against noise of a run's GRPO steps, from per-group gradients
recomputed from its buffers (tbhpc/train/gradnoise.py)."""
from __future__ import annotations

from pathlib import Path

from tbhpc.cli.options import float_in, int_in
from tbhpc.errors import UserError


def add_parser(sub) -> None:
    n = sub.add_parser("grad-noise", help="signal vs noise of a run's GRPO steps (per-group gradients from its buffers)")
    n.set_defaults(func=run)
    n.add_argument("run", type=Path, help="a training run directory (its buffers/ and config.yaml)")
    n.add_argument("--steps", default="1-4", help="steps whose groups to measure: 1-4 or 1,3,5 (default 1-4)")
    n.add_argument("--model", type=Path, help="the weights to measure at (default: the run's initial model)")
    n.add_argument("--threads", type=int_in(1, 256), default=2)
    n.add_argument("--temperature", type=float_in(1e-3, 100), default=1.0,
                   help="gradient of softmax(logits / T) (default 1: what the trainer steps on)")
    n.add_argument("--tokens", default="all", help="take the gradient over these generated tokens only: all (default), "
                   "choices (sampled with p < 0.9), confident (p >= 0.9), tool-calls, text")


def run(args) -> int:
    import yaml

    from tbhpc.train.gradnoise import TOKEN_CLASSES, group_gradients, informative_groups, noise_of, report
    if args.tokens not in TOKEN_CLASSES:
        raise UserError(f"grad-noise: --tokens must be one of {', '.join(TOKEN_CLASSES)}, got {args.tokens!r}")
    cfg_file = args.run / "config.yaml"
    if not cfg_file.exists():
        raise UserError(f"grad-noise: {cfg_file} not found (is {args.run} a training run?)")
    cfg = yaml.safe_load(cfg_file.read_text()) or {}
    model_dir = str(args.model or cfg.get("model", ""))
    from tbhpc.policy.hf import model_dir_problem
    if problem := model_dir_problem(model_dir):
        raise UserError(f"grad-noise: {'--model' if args.model else f'{cfg_file} field model'}: {problem}")
    steps = _step_list(args.steps)
    groups = informative_groups(args.run / "buffers", steps)
    if len(groups) < 2:
        raise UserError(f"grad-noise: steps {args.steps} of {args.run} hold {len(groups)} informative group(s); need 2 or more")
    if args.temperature <= 0:
        raise UserError(f"grad-noise: --temperature must be > 0, got {args.temperature}")
    import torch
    from transformers import AutoModelForCausalLM

    from tbhpc.train.gradnoise import token_mask
    torch.set_num_threads(args.threads)
    ids: list[int | None] = [None, None]
    if args.tokens in ("tool-calls", "text"):     # only these classes need the call markers' ids
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(model_dir)
        ids = [tok.convert_tokens_to_ids(t) for t in ("<tool_call>", "</tool_call>")]
        ids = [i if isinstance(i, int) and i != tok.unk_token_id else None for i in ids]
        token_mask(groups[0][0], args.tokens, *ids)      # no call markers: one line, before any gradient
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    print(f"grad-noise: {len(groups)} informative groups of steps {args.steps}, gradients at {model_dir}", flush=True)
    noise = noise_of(group_gradients(model, groups, args.temperature, lambda e: token_mask(e, args.tokens, *ids)))
    from tbhpc.train.config import TrainConfig
    where = f"{args.run} steps {args.steps}" + (f", {args.tokens} tokens" if args.tokens != "all" else "")
    print(report(noise, int(cfg.get("groups_per_step", TrainConfig.groups_per_step)), where))
    return 0


def _step_list(text: str) -> list[int]:
    try:
        if "-" in text:
            a, b = text.split("-", 1)
            return list(range(int(a), int(b) + 1))
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"grad-noise: --steps {text!r}: expected 1-4 or 1,3,5") from None
