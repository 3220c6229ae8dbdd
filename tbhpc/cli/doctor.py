"""`tbhpc doctor [CONFIG]`: what this node will run (torch, CUDA, NCCL, DeepSpeed, vLLM, Slurm),
and one line per thing that would stop the training config given (tbhpc/doctor.py)."""
from __future__ import annotations

import sys
from pathlib import Path

from tbhpc.cli.options import add_overrides


def add_parser(sub) -> None:
    dr = sub.add_parser("doctor", help="what this node will run (torch, CUDA, NCCL, DeepSpeed, vLLM build, flash-attn, "
                                       "nvcc, Slurm) and one line per thing that would stop the training config given")
    dr.set_defaults(func=run)
    dr.add_argument("config", type=Path, nargs="?", help="a YAML train config to check against this node")
    dr.add_argument("--lock", type=Path, help="compare the installed packages with this lock (default: "
                    "env/locks/trainer-cpu.txt or trainer-cuda.txt, by the torch build)")
    add_overrides(dr)


def run(args) -> int:
    """Exit 0 when nothing would stop the config (or none is given), 1 with one line per problem."""
    from tbhpc.doctor import probe, problems, render
    cfg = serve = None
    found: list[str] = []
    if args.config or args.overrides:
        from tbhpc.config import load_config
        from tbhpc.train.config import TrainConfig
        cfg = load_config(TrainConfig, args.config, args.overrides)
        if cfg.generator == "server":
            from tbhpc.launch.train import serve_config_for
            serve = serve_config_for(cfg)
    if args.lock is not None and not args.lock.is_file():
        from tbhpc.errors import UserError
        raise UserError(f"--lock: no such file: {args.lock}")
    node = probe(serve.python if serve is not None else None, str(args.lock) if args.lock else None)
    if cfg is not None:
        from tbhpc.plan.memory import plan, plannable
        if plannable(cfg.model):      # on a GPU node, with the attention kernel the trainer will get there
            p = plan(cfg, flash=node.flash_attn if node.gpus else None)
            if not p.fits:
                found.append(f"memory: {p.problem}")
    found = problems(node, cfg, serve) + found
    print(render(node, found, subject="the config" if cfg is not None else "a run on this node"), flush=True)
    for line in found:
        print(f"tbhpc: doctor: {line}", file=sys.stderr)
    return 1 if found else 0
