"""The tasks an OpenEnv server offers: a pack (checked as every campaign checks it) or a
ThinkingBox data checkout, optionally narrowed to a list of ids."""
from __future__ import annotations

from tbhpc.errors import UserError
from tbhpc.tasks.schema import Task


def load_served_tasks(pack: str, ids: list[str] | None = None) -> list[Task]:
    from tbhpc.tb.dataset import TBDataset, is_tb_source
    if is_tb_source(pack):
        return TBDataset(pack).tasks(ids)
    from tbhpc.tasks.checked import check_pack
    from tbhpc.tasks.loader import load_pack, resolve_pack
    path = resolve_pack(pack)
    tasks = load_pack(path)
    check_pack(path, tasks)          # a broken task must not be served and scored
    if ids is None:
        return tasks
    by_id = {t.id: t for t in tasks}
    missing = [i for i in ids if i not in by_id]
    if missing:
        raise UserError(f"task id {missing[0]!r} is not in pack {path} ({len(missing)} unknown)")
    return [by_id[i] for i in dict.fromkeys(ids)]
