"""`tbhpc serve RUN`: run the policy server for a run (here, or as a Slurm job with
`--executor slurm`; `--dry-run` prints the job script). Config: jobs/serve.yaml + key=value."""
from __future__ import annotations

import os
import subprocess
from dataclasses import asdict
from pathlib import Path

import yaml

from tbhpc.cli.options import add_overrides
from tbhpc.errors import UserError
from tbhpc.outpaths import out_arg


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="serve the policy with vLLM for a run: endpoint.json, weight syncs")
    p.set_defaults(func=run)
    p.add_argument("run", type=out_arg, help="run directory (endpoint.json, checkpoints/, logs/ live there)")
    p.add_argument("--config", type=Path, help="YAML serve config (see jobs/serve.yaml)")
    p.add_argument("--executor", choices=("local", "slurm"), default="local")
    p.add_argument("--dry-run", action="store_true", help="print what would run (sbatch script or vLLM command)")
    add_overrides(p)


def run(args) -> int:
    from tbhpc.serve.config import load_serve_config
    cfg = load_serve_config(args.config, args.overrides)
    from tbhpc.outpaths import check_folder_path
    check_folder_path(args.run, "serve: run directory")     # a dry run refuses what the real one would
    run_dir = args.run.resolve()
    if args.executor == "slurm":
        return _submit(cfg, run_dir, args.dry_run)
    if args.dry_run:
        from tbhpc.serve.auth import token_path
        from tbhpc.serve.command import vllm_argv, vllm_env
        from tbhpc.serve.supervisor import resolve_device
        r = resolve_device(cfg)
        print(" ".join(f"{k}={v}" for k, v in sorted(vllm_env(r, {}, token_path(run_dir)).items())) + " \\\n  " + " ".join(vllm_argv(r, cfg.model, cfg.port or 8000)))
        return 0
    from tbhpc.serve.supervisor import Supervisor
    return Supervisor(run_dir, cfg, log=lambda m: print(m, flush=True)).run_forever()


def _submit(cfg, run_dir: Path, dry_run: bool) -> int:
    from tbhpc.launch.sbatch import render_serve
    cfg_path = run_dir / "serve.yaml"
    text = render_serve(str(run_dir), str(cfg_path), cfg.slurm, os.getcwd(),
                        gpus=cfg.tensor_parallel_size * cfg.data_parallel_size if cfg.device == "cuda" else 0)
    if dry_run:
        print(text, end="")
        return 0
    (run_dir / "logs" / "slurm").mkdir(parents=True, exist_ok=True)
    from tbhpc.serve.auth import ensure_token
    ensure_token(run_dir)       # made here, where the user's umask and file system are known to work
    cfg_path.write_text(yaml.safe_dump(asdict(cfg), sort_keys=False))
    script = run_dir / "slurm" / "serve.sbatch"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(text)
    out = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True)
    if out.returncode != 0:
        raise UserError(f"sbatch {script}: {out.stderr.strip()}")
    print(f"submitted serve job {out.stdout.strip().split(';')[0]}; it writes {run_dir / 'endpoint.json'} when ready")
    return 0
