"""`tbhpc serve-check RUN | --url URL`: does a server compute the weights it claims? Exact weight
digests and a fingerprint probe (tbhpc/serve/verify.py); exit 0 on a match, 1 on a mismatch."""
from __future__ import annotations

from pathlib import Path

from tbhpc.cli.options import float_in, http_url
from tbhpc.errors import UserError


def add_parser(sub) -> None:
    p = sub.add_parser("serve-check", help="verify a server computes the weights it claims (exact weight digests + fingerprint probe)")
    p.set_defaults(func=run)
    p.add_argument("run", nargs="?", type=Path, help="run directory of `tbhpc serve` (endpoint.json, checkpoint markers)")
    p.add_argument("--url", type=http_url, help="a vLLM server you run yourself (http://host:port), instead of RUN")
    p.add_argument("--token-file", type=Path, help="with --url: a file holding the server's token (RUN: the run's own)")
    p.add_argument("--model", default="", help="served model name (default: the first of /v1/models)")
    p.add_argument("--checkpoint", type=Path,
                   help="the HF directory it should serve (digested and fingerprinted here on the CPU); default: the run's marker")
    p.add_argument("--tol", type=float_in(0, 100), default=0.0, help="mean |Δ logprob| allowed (default: by dtype)")
    p.add_argument("--format", choices=("text", "json"), default="text")


def run(args) -> int:
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
