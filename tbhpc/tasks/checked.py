"""A pack checked the way `tbhpc tasks validate` checks it, by every command that runs its tasks.

Why: a golden call to an unknown tool, or a parameter of the wrong type, fails the same way in
the golden replay and in the agent's episode, so the two final states hash alike and the broken
task is scored a pass. A campaign, a probe, a training pool and a single `tbhpc episode` therefore
refuse such a pack before anything is created: one line naming the file, task and field.
Tasks served by MCP servers (`backend:`) are checked against the servers themselves
(`tbhpc.env.registry.preflight`), not here.
"""
from __future__ import annotations

from pathlib import Path

from tbhpc.errors import PackError
from tbhpc.tasks.loader import load_exclusions, validate_tasks
from tbhpc.tasks.schema import Task


def check_pack(pack: Path, tasks: list[Task]) -> None:
    """Tools, parameter types, tables and columns of every built-in task; the pack's exclusion
    list (`eval_ids.txt`) against its eval split. Raises PackError."""
    from tbhpc.domains import KNOWN, catalogs
    builtin = [t for t in tasks if not t.backend]
    validate_tasks(builtin, catalogs({t.domain for t in builtin}), known=KNOWN)
    excl = Path(pack) / "eval_ids.txt" if Path(pack).is_dir() else None
    if excl is not None and excl.exists():
        listed, evals = load_exclusions(excl), {t.id for t in tasks if t.split == "eval"}
        if listed != evals:
            bad = sorted(listed ^ evals)[0]
            raise PackError(str(excl), f"exclusion list disagrees with the pack's eval split (first: {bad})")
