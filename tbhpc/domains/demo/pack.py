"""Write the demo pack (`tbhpc tasks generate --pack demo`): thousands of train instances and an
instance-disjoint eval split of every demo template, checked by golden replay, as YAML files plus
`eval_ids.txt`, exactly like the full pack (tbhpc/domains/pack.py).

Deterministic: same seed, same bytes. Each (domain, template, split) draws from its own seeded
stream, so adding a template or changing a count leaves every other instance as it was. Another
seed (`--seed N`) writes fresh instances of the same templates, with ids tagged `s<N>`, for an
evaluation on instances nobody trained or tuned on. An eval instance never repeats a train
instance (same request and same rows): such a draw is skipped.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tbhpc.domains.demo import DEMO_DOMAIN_NAMES, module
from tbhpc.domains.demo.cases import Case
from tbhpc.domains.gen import Gen
from tbhpc.domains.pack import check_task, render_domain_file
from tbhpc.tasks.schema import Task

DEMO_SEED = 7
PACK_NAME = "tbhpc-demo"
TRAIN_PER_TEMPLATE = 400
EVAL_PER_TEMPLATE = 10


@dataclass(frozen=True)
class Instance:
    task: Task
    case: Case


def template_instances(domain: str, template: str, split: str, count: int, seed: int,
                       skip: set[str] | None = None) -> list[Instance]:
    """`count` instances of one template for one split; draws whose fingerprint is in `skip`
    (or repeats one already drawn) are skipped; `skip` gains the fingerprints drawn."""
    fn = module(domain).TEMPLATES[template]
    gen = Gen(seed, f"{domain}:{template}:{split}", "2025-10-01", prefix="")
    skip = set() if skip is None else skip
    tag = "" if seed == DEMO_SEED else f"s{seed}-"
    out, tries = [], 0
    while len(out) < count:
        tries += 1
        if tries > 20 * count:
            raise RuntimeError(f"{domain}/{template}: cannot draw {count} distinct {split} instances")
        case = fn(gen)
        fp = fingerprint(case)
        if fp in skip:
            continue
        skip.add(fp)
        k = len(out)
        task = case.task(case.branch, id=f"{domain}-{template}-{tag}{split}{k:04d}", domain=domain, template=template,
                         instance=f"{domain}/{template}/{tag}{split}/{k:04d}", split=split)
        out.append(Instance(task, case))
    return out


def fingerprint(case: Case) -> str:
    return json.dumps([case.query, case.patch], sort_keys=True)


def demo_instances(seed: int = DEMO_SEED, train: int = TRAIN_PER_TEMPLATE, eval: int = EVAL_PER_TEMPLATE,
                   domains: tuple[str, ...] = DEMO_DOMAIN_NAMES, avoid_seed: int | None = None) -> list[Instance]:
    """Every template's train then eval instances. `avoid_seed`: none of them repeats an instance of
    the pack drawn with that seed (at its full size): instances a model trained on that pack never saw."""
    out = []
    for domain in domains:
        for template in module(domain).TEMPLATES:
            seen: set[str] = set()
            if avoid_seed is not None:
                for split, n in (("train", TRAIN_PER_TEMPLATE), ("eval", EVAL_PER_TEMPLATE)):
                    template_instances(domain, template, split, n, avoid_seed, seen)
            out += template_instances(domain, template, "train", train, seed, seen)
            out += template_instances(domain, template, "eval", eval, seed, seen)
    return out


def write_demo_pack(out: Path, seed: int = DEMO_SEED, train: int = TRAIN_PER_TEMPLATE,
                    eval: int = EVAL_PER_TEMPLATE, avoid_seed: int | None = None) -> dict[str, int]:
    """One YAML per domain + eval_ids.txt; every task's golden calls replayed first."""
    instances = demo_instances(seed, train, eval, avoid_seed=avoid_seed)
    for inst in instances:
        check_task(inst.task)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    counts = {}
    for domain in DEMO_DOMAIN_NAMES:
        tasks = [i.task for i in instances if i.task.domain == domain]
        (out / f"{domain}.yaml").write_text(render_domain_file(domain, tasks, PACK_NAME), encoding="utf-8")
        counts[domain] = len(tasks)
    eval_ids = sorted(i.task.id for i in instances if i.task.split == "eval")
    header = "# Held-out benchmark ids (split: eval). Exclude these from any training pool.\n"
    (out / "eval_ids.txt").write_text(header + "".join(f"{i}\n" for i in eval_ids), encoding="utf-8")
    return counts
