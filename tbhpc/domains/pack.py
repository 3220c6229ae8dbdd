"""Build the bundled task pack: every domain's templates, checked by golden replay, written as
YAML (one file per domain) plus `eval_ids.txt`, the exclusion list of held-out benchmark ids.

Deterministic: same seed -> byte-identical files (seeded RNG, fixed key order, no timestamps).
"""
from __future__ import annotations

import importlib
from pathlib import Path

import yaml

from tbhpc.domains import DOMAIN_NAMES, get_domain
from tbhpc.domains.gen import generate
from tbhpc.env.golden import initial_state
from tbhpc.env.state import canonical_state, state_hash
from tbhpc.tasks.schema import Task

DEFAULT_SEED = 20251001
PACK_NAME = "tbhpc-default"


class TemplateBug(Exception):
    """A template produced a task its own golden calls cannot solve."""


def domain_tasks(name: str, seed: int = DEFAULT_SEED) -> list[Task]:
    domain = get_domain(name)
    templates = importlib.import_module(f"tbhpc.domains.{name}.templates").TEMPLATES
    tasks = generate(name, templates, seed, domain.scenario.current_date, prefix=name[:2].upper())
    for t in tasks:
        check_task(t)
    return tasks


def check_task(task: Task) -> None:
    """Golden calls must all succeed; a read-only golden must carry an output check or rubric."""
    domain = get_domain(task.domain)
    backend = domain.backend(task)
    box = domain.toolbox(backend)
    for call in task.golden_calls:
        res = box.call(call.tool, dict(call.parameters))
        if not res.ok:
            raise TemplateBug(f"{task.id}: golden call {call.tool} failed: {res.output}")
    changed = state_hash(canonical_state(backend)) != state_hash(initial_state(domain, task))
    backend.conn.close()
    if not changed and not (task.output_contains or task.rubrics_yesno):
        raise TemplateBug(f"{task.id}: read-only golden state without an output check or rubric")
    if not 1 <= len(task.golden_calls) <= 10:
        raise TemplateBug(f"{task.id}: {len(task.golden_calls)} golden calls (want 1-10)")


def render_domain_file(name: str, tasks: list[Task], pack: str = PACK_NAME) -> str:
    doc = {"pack": pack, "domain": name, "tasks": [_strip_domain(t.to_dict()) for t in tasks]}
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=120, default_flow_style=False)


def _strip_domain(d: dict) -> dict:
    d.pop("domain", None)  # the file names its domain once
    return d


def write_pack(out: Path, seed: int = DEFAULT_SEED, domains: tuple[str, ...] = DOMAIN_NAMES) -> dict[str, int]:
    out.mkdir(parents=True, exist_ok=True)
    counts, eval_ids = {}, []
    for name in domains:
        tasks = domain_tasks(name, seed)
        (out / f"{name}.yaml").write_text(render_domain_file(name, tasks), encoding="utf-8")
        eval_ids += [t.id for t in tasks if t.split == "eval"]
        counts[name] = len(tasks)
    header = "# Held-out benchmark ids (split: eval). Exclude these from any training pool.\n"
    (out / "eval_ids.txt").write_text(header + "".join(f"{i}\n" for i in sorted(eval_ids)), encoding="utf-8")
    return counts


def extra_instances(seeds: int, held_out: list[Task], domains: tuple[str, ...] = DOMAIN_NAMES) -> list[Task]:
    """More instances of the bundled templates for supervised warm starts: the generator run with
    `seeds` other seeds (1000 + i; the generator's own default is DEFAULT_SEED). All are training
    material (split `train`, ids prefixed `aug<i>-`); an instance whose user facts equal a held-out
    task's is dropped, so no evaluation conversation is ever learned verbatim."""
    import dataclasses
    seen = {t.user_context for t in held_out}
    out = []
    for i in range(1, seeds + 1):
        for name in domains:
            for t in domain_tasks(name, 1000 + i):
                if t.user_context not in seen:
                    out.append(dataclasses.replace(t, id=f"aug{i}-{t.id}", split="train", instance=f"aug{i}/{t.instance}"))
    return out
