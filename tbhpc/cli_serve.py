"""`tbhpc serve RUN`: run the policy server for a run (here, or as a Slurm job with
`--executor slurm`; `--dry-run` prints the job script). Config: jobs/serve.yaml + key=value."""
from __future__ import annotations

import os
import subprocess
from dataclasses import asdict
from pathlib import Path

import yaml

from tbhpc.cli_types import float_in
from tbhpc.config import load_config
from tbhpc.errors import UserError


def add_parsers(sub) -> None:
    p = sub.add_parser("serve", help="serve the policy with vLLM for a run: endpoint.json, weight syncs")
    p.add_argument("run", type=Path, help="run directory (endpoint.json, checkpoints/, logs/ live there)")
    p.add_argument("--config", type=Path, help="YAML serve config (see jobs/serve.yaml)")
    p.add_argument("--executor", choices=("local", "slurm"), default="local")
    p.add_argument("--dry-run", action="store_true", help="print what would run (sbatch script or vLLM command)")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE")


def run(args) -> int:
    from tbhpc.serve.config import ServeConfig
    cfg = load_config(ServeConfig, args.config, args.overrides)
    cfg.validate(str(args.config or "serve config"))
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


def add_check_parser(sub) -> None:
    p = sub.add_parser("serve-check", help="verify a server computes the weights it claims (exact weight digests + fingerprint probe)")
    p.add_argument("run", nargs="?", type=Path, help="run directory of `tbhpc serve` (endpoint.json, checkpoint markers)")
    p.add_argument("--url", help="a vLLM server you run yourself (http://host:port), instead of RUN")
    p.add_argument("--token-file", type=Path, help="with --url: a file holding the server's token (RUN: the run's own)")
    p.add_argument("--model", default="", help="served model name (default: the first of /v1/models)")
    p.add_argument("--checkpoint", type=Path,
                   help="the HF directory it should serve (digested and fingerprinted here on the CPU); default: the run's marker")
    p.add_argument("--tol", type=float_in(0, 100), default=0.0, help="mean |Δ logprob| allowed (default: by dtype)")
    p.add_argument("--format", choices=("text", "json"), default="text")


def run_check(args) -> int:
    """Print served version, probe errors, digest comparison, PASS/FAIL; exit 0 on a match, 1 on a mismatch."""
    import json

    from tbhpc.serve.verify import check_endpoint
    if bool(args.run) == bool(args.url):
        raise UserError("serve-check: give either RUN or --url")
    if args.token_file and not args.url:
        raise UserError("serve-check: --token-file goes with --url (RUN names its own token file)")
    check, source = check_endpoint(run=args.run, url=args.url, model=args.model, checkpoint=args.checkpoint, tol=args.tol,
                                   token_file=args.token_file)
    if args.format == "json":
        print(json.dumps({**check.to_json(), "fingerprint": source}))
    else:
        print(f"{check.summary()} [fingerprint: {source}]")
    return 0 if check.passed else 1
