"""`tbhpc tasks list|show|validate|export-tb|generate`: what a pack holds, whether it is sound,
and writing packs (regenerated from templates, or as a ThinkingBox data dir)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

from tbhpc.cli.options import non_empty
from tbhpc.errors import PackError, UserError
from tbhpc.outpaths import check_output_folder, out_arg
from tbhpc.tasks.checked import check_pack
from tbhpc.tasks.loader import load_pack, pack_files, resolve_pack


def add_parser(sub) -> None:
    tasks = sub.add_parser("tasks", help="list, show, validate or generate task packs")
    tsub = tasks.add_subparsers(dest="tasks_cmd", required=True)
    for name in ("list", "show", "validate"):
        p = tsub.add_parser(name)
        p.set_defaults(func=run)
        if name == "show":
            p.add_argument("task_id")
        p.add_argument("pack", nargs="?", type=non_empty("a pack"), default=None,
                       help="pack file or directory, or tb:DIR (default: bundled pack)")
        p.add_argument("--format", choices=("table", "json"), default="table")
        if name == "validate":
            p.add_argument("--servers", default=None, help="tb: sources: also start each scenario's servers, check its "
                                                           "tools and one real __reserved__init")
            p.add_argument("--tasks", type=Path, default=None, help="tb: sources: only the tasks this test list names")
            p.add_argument("--strict", action="store_true", help="tb: sources: a test file tbhpc cannot grade is an "
                                                                 "error (default: skipped, with its reason)")
        if name == "list":
            p.add_argument("--domain")
            p.add_argument("--split", choices=("train", "eval"))
    x = tsub.add_parser("export-tb", help="write built-in tasks as a ThinkingBox data dir served by `tbhpc mcp-serve`")
    x.set_defaults(func=run)
    x.add_argument("--out", type=out_arg, required=True)
    x.add_argument("--force", action="store_true", help="write into a non-empty folder that is not a previous export")
    x.add_argument("pack", nargs="?", type=non_empty("a pack"), default=None, help="pack file or directory (default: bundled pack)")
    x.add_argument("--domain", action="append", default=[], help="only these domains (repeatable)")
    x.add_argument("--split", choices=("train", "eval", "all"), default="all")
    g = tsub.add_parser("generate", help="regenerate a bundled pack from its templates (or fresh instances: --seed)")
    g.set_defaults(func=run)
    g.add_argument("--out", type=out_arg, required=True)
    g.add_argument("--force", action="store_true", help="write into a non-empty folder that is not a pack")
    g.add_argument("--pack", choices=("full", "demo"), default="full",
                   help="full: the pack for real models (default); demo: the compact pack sized for the demo model")
    g.add_argument("--seed", type=int, default=None, help="another seed writes fresh instances of the same templates")


def run(args) -> int:
    if args.tasks_cmd == "generate":
        check_output_folder(args.out, "pack", force=args.force)
        if args.pack == "demo":
            from tbhpc.domains.demo.pack import DEMO_SEED, write_demo_pack
            counts = write_demo_pack(args.out, args.seed if args.seed is not None else DEMO_SEED)
        else:
            from tbhpc.domains.pack import DEFAULT_SEED, write_pack
            counts = write_pack(args.out, args.seed if args.seed is not None else DEFAULT_SEED)
        print(f"wrote {sum(counts.values())} tasks to {args.out}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
        return 0
    if args.tasks_cmd == "export-tb":
        from tbhpc.mcp.export import write_dataset
        check_output_folder(args.out, "tb-data", force=args.force)
        pack = resolve_pack(args.pack)
        tasks = load_pack(pack)
        check_pack(pack, tasks)        # a broken task exported would be graded as a pass by the reference harness
        unknown = sorted(set(args.domain) - {t.domain for t in tasks})
        if unknown:
            raise PackError(str(pack), f"--domain {unknown[0]!r}: no task of the pack is in it (its domains: "
                                       f"{', '.join(sorted({t.domain for t in tasks}))})")
        tasks = [t for t in tasks if (not args.domain or t.domain in args.domain) and args.split in ("all", t.split)]
        if not tasks:
            raise PackError(str(pack), "no task matches --domain/--split")
        out = write_dataset(tasks, args.out)
        print(f"wrote {len(tasks)} tasks to {out}: run them with pack=tb:{out} tasks={out / 'testlist.yaml'} "
              f"servers={out / 'servers.yaml'}")
        return 0
    from tbhpc.tb.dataset import TBDataset, is_tb_source
    tb = is_tb_source(args.pack)
    pack = args.pack if tb else resolve_pack(args.pack)
    if tb:
        from tbhpc.tasks.loader import read_id_list
        dataset = TBDataset(pack, strict=getattr(args, "strict", False))
        tasks = dataset.tasks(read_id_list(args.tasks) if getattr(args, "tasks", None) else None)
        for file, why in dataset.skipped.items():
            print(f"tbhpc: skipped {file}: {why}", file=sys.stderr)
    else:   # every command that reads a pack checks it as `validate` does (listing included)
        tasks = load_pack(pack)
        check_pack(pack, tasks)
    if args.tasks_cmd == "list":
        domains = sorted({t.domain for t in tasks})
        if args.domain and args.domain not in domains:
            raise UserError(f"tasks list --domain {args.domain!r}: {pack} has no such domain (its domains: "
                            f"{', '.join(domains) or 'none'})")
        rows = [t for t in tasks if (not args.domain or t.domain == args.domain) and (not args.split or t.split == args.split)]
        if args.format == "json":
            print(json.dumps([{"id": t.id, "domain": t.domain, "split": t.split, "n_golden_calls": t.n_golden_calls,
                               "template": t.template, "tags": list(t.tags)} for t in rows], indent=1))
        else:
            from rich.console import Console
            from rich.table import Table
            table = Table("id", "domain", "split", "golden calls", "tags")
            for t in rows:
                table.add_row(t.id, t.domain, t.split, str(t.n_golden_calls), " ".join(t.tags))
            Console().print(table)
        return 0
    if args.tasks_cmd == "show":
        task = next((t for t in tasks if t.id == args.task_id), None)
        if task is None:
            raise PackError(str(pack), "no such task", args.task_id, "id")
        d = task.to_dict()
        print(json.dumps(d, indent=1) if args.format == "json" else yaml.safe_dump(d, sort_keys=False, allow_unicode=True))
        return 0
    # validate
    if tb:   # every test file parsed (never run); with --servers, every scenario's servers start and offer its tools
        if getattr(args, "servers", None):
            from tbhpc.env.registry import preflight
            preflight(tasks, args.servers)
        from tbhpc.agents import unanswerable_rubrics
        scenarios = sorted({t.domain for t in tasks})
        no_keywords = unanswerable_rubrics(tasks, "keyword")
        msg = (f"OK: {len(tasks)} tasks in {len(scenarios)} scenario(s)"
               + (f"; skipped {len(dataset.skipped)} file(s) tbhpc cannot grade (above; --strict makes them errors)"
                  if dataset.skipped else "")
               + ("" if args.servers else " (servers not checked: --servers FILE)"))
        if no_keywords:
            msg += (f"\nnote: {len(no_keywords)} task(s) have yes/no rubrics without keywords: run them with an LLM "
                    "judge (judge=openai judge_url=URL) or rubrics=skip")
        print(json.dumps({"ok": True, "tasks": len(tasks), "skipped_files": dataset.skipped,
                          "rubrics_without_keywords": len(no_keywords)}) if args.format == "json" else msg)
        return 0
    msg = f"OK: {len(tasks)} tasks in {len(pack_files(pack))} file(s) ({sum(t.split == 'eval' for t in tasks)} eval)"
    print(json.dumps({"ok": True, "tasks": len(tasks)}) if args.format == "json" else msg)
    return 0
