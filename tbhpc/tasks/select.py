"""Which tasks a stage runs: a pack (bundled, a path, or a ThinkingBox checkout `tb:DIR`), an
optional id list, a split, domains and a limit, in that order.

Why apart from the campaign config: campaigns, training (`pool=`), the warm start and the demo
all choose tasks the same way, and none but the campaign has a campaign config. Every pack read
here is checked as `tbhpc tasks validate` checks it (a broken task must never be scored).
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

from tbhpc.errors import UserError
from tbhpc.tasks.checked import check_pack
from tbhpc.tasks.loader import load_pack, read_id_list, resolve_pack
from tbhpc.tasks.schema import Task
from tbhpc.tb.dataset import TBDataset, is_tb_source

SPLITS = ("train", "eval", "all")


def pack_source(pack: str | Path | None) -> Path | str:
    """The pack as the loaders take it: `tb:DIR` kept as is, anything else a path."""
    return str(pack) if is_tb_source(pack) else resolve_pack(pack)


def select_tasks(pack: str | Path | None = None, ids: str | Path | Sequence[str] | None = None, split: str = "all",
                 domains: Sequence[str] = (), limit: int | None = None,
                 skipped: dict[str, str] | None = None) -> list[Task]:
    """The tasks of `pack` named by `ids` (a file of ids, or the ids; when given, `split` is not
    applied: an id list says exactly what to run), else those of `split`; then only `domains`,
    then the first `limit`. `skipped` (if given) receives the ThinkingBox files left out, and why."""
    if split not in SPLITS:
        raise UserError(f"split: expected one of {', '.join(SPLITS)}, got {split!r}")
    listed = read_id_list(ids) if isinstance(ids, (str, Path)) else list(ids) if ids is not None else None
    if is_tb_source(pack):
        dataset = TBDataset(pack)
        tasks = dataset.tasks(listed)
        if skipped is not None:
            skipped.update(dataset.skipped)
    else:
        path = resolve_pack(pack)
        tasks = load_pack(path)
        check_pack(path, tasks)
        if listed is not None:
            tasks = _by_id(tasks, listed, path, ids)
        else:
            tasks = [t for t in tasks if split == "all" or t.split == split]
    if domains:
        tasks = [t for t in tasks if t.domain in set(domains)]
    if limit is not None:
        tasks = tasks[:limit]
    if not tasks:
        raise UserError("the selection holds no tasks (check split, tasks, domains, limit)")
    return tasks


def _by_id(tasks: list[Task], ids: list[str], pack: Path, source) -> list[Task]:
    by_id = {t.id: t for t in tasks}
    missing = [i for i in ids if i not in by_id]
    if missing:
        where = f"{source}: " if isinstance(source, (str, Path)) else ""
        raise UserError(f"{where}task id {missing[0]!r} is not in pack {pack} ({len(missing)} unknown)")
    return [by_id[i] for i in dict.fromkeys(ids)]
