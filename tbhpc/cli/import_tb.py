"""`tbhpc import-tb FILES --out RUN`: ThinkingBox `tb infer` results as a tbhpc run directory."""
from __future__ import annotations

from pathlib import Path

from tbhpc.cli.options import non_empty
from tbhpc.outpaths import out_arg


def add_parser(sub) -> None:
    i = sub.add_parser("import-tb", help="import ThinkingBox `tb infer` JSONL results into a run directory")
    i.set_defaults(func=run)
    i.add_argument("files", type=Path, nargs="+")
    i.add_argument("--out", type=out_arg, required=True)
    i.add_argument("--campaign", help="campaign name (default: the first file's stem)")
    i.add_argument("--policy-id", type=non_empty("a policy id"), default="thinkingbox")
    i.add_argument("--lenient", action="store_true", help="convert values of the wrong type (e.g. \"yes\" for true, "
                   "a number as uid, negative tokens to 0) instead of stopping; the lines converted are counted")


def run(args) -> int:
    from tbhpc.store.import_tb import import_files
    _, rep = import_files(args.files, args.out, args.campaign, args.policy_id, lenient=args.lenient)
    print(f"{args.out}: imported {rep.rows} attempt rows for {rep.tasks} tasks ({rep.reader} read); "
          f"{rep.system_errors} system error(s)" + (f"; {rep.coerced} line(s) with values converted (--lenient)"
                                                     if args.lenient else ""))
    return 0
