"""Is a campaign complete? Exactly tasks x repeats keys, no duplicates, no system errors left.

By default a run is checked against its own plan; `--tasks` / `--repeats` check it against an
external list instead (as the reference evaluation does against its release test list).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from tbhpc.store.merge import connect
from tbhpc.store.run_dir import RunDir


@dataclass
class Validation:
    expected: int
    found: int
    missing: list[tuple[str, int]] = field(default_factory=list)
    unexpected: list[tuple[str, int]] = field(default_factory=list)
    duplicates: list[tuple[str, int]] = field(default_factory=list)
    system_errors: list[tuple[str, int]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.unexpected or self.duplicates or self.system_errors)

    def reason(self) -> str:
        parts = [f"{len(v)} {name}" for name, v in (("missing", self.missing), ("unexpected", self.unexpected),
                                                      ("duplicate", self.duplicates), ("system-error", self.system_errors)) if v]
        return ", ".join(parts) + " key(s)" if parts else "complete"

    def summary(self) -> str:
        head = f"{self.found} attempt rows for {self.expected} expected keys: {self.reason()}"
        examples = [f"  {name}: {k[0]}#{k[1]}" for name, keys in (("missing", self.missing), ("unexpected", self.unexpected),
                    ("duplicate", self.duplicates), ("system error", self.system_errors)) for k in keys[:3]]
        return "\n".join([head, *examples])


def validate(run: RunDir, task_ids: list[str] | None = None, repeats: int | None = None) -> Validation:
    camp = run.require().campaign()
    plan = {r["task_id"]: r["repeats"] for r in run.plan()}
    if task_ids is not None:
        plan = {t: repeats or plan.get(t, 1) for t in task_ids}
    elif repeats is not None:
        plan = {t: repeats for t in plan}
    expected = {(t, i) for t, n in plan.items() for i in range(n)}
    con = connect(run, read_only=True) if run.db.exists() else None
    rows = [] if con is None else con.execute(
        "SELECT task_id, attempt_index, status FROM attempts WHERE campaign = ? AND policy_id = ?",
        [camp["campaign"], camp["policy_id"]]).fetchall()
    if con is not None:
        con.close()
    counts = Counter((t, i) for t, i, _ in rows)
    found = set(counts)
    return Validation(
        expected=len(expected), found=len(rows),
        missing=sorted(expected - found), unexpected=sorted(found - expected),
        duplicates=sorted(k for k, n in counts.items() if n > 1),
        system_errors=sorted((t, i) for t, i, s in rows if s == "system_error"),
    )
