"""Is a campaign complete? Exactly tasks x repeats keys, no duplicates, no system errors left,
and a results file whose every block reads back (its checksums are verified as DuckDB reads it).

By default a run is checked against its own plan; `--tasks` / `--repeats` check it against an
external list instead (as the reference evaluation does against its release test list).
`checked_counts` is what `agg`, `report` and the API count from: nothing of an incomplete run
is reported as a result unless the user says so.
"""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from tbhpc.errors import UserError
from tbhpc.metrics.agg import Counts, load_counts
from tbhpc.store.health import check_every_block
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
    """Set arithmetic in DuckDB (a million keys check in well under a second)."""
    camp = run.require().campaign()
    own_plan = task_ids is None and repeats is None
    plan: dict[str, int] = {}
    if not own_plan or not run.db.exists():
        plan = {r["task_id"]: r["repeats"] for r in run.plan()}
        if task_ids is not None:
            plan = {t: repeats or plan.get(t, 1) for t in task_ids}
        elif repeats is not None:
            plan = {t: repeats for t in plan}
    if not run.db.exists():
        return Validation(sum(plan.values()), 0, missing=sorted((t, i) for t, n in plan.items() for i in range(n)))
    con = connect(run, read_only=True, files=True)   # an external key list is read from a file
    external = None
    try:
        check_every_block(con, run.db)   # damage anywhere in the file, not only where these queries read
        if own_plan:  # the plan table holds what the run planned (loaded by merge)
            source = "(SELECT task_id, repeats FROM plan WHERE campaign = $c AND policy_id = $p)"
        else:  # an external list goes through a file: big Python list parameters are slow in DuckDB
            with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
                f.writelines(json.dumps({"task_id": t, "repeats": n}) + "\n" for t, n in plan.items())
            external = f.name
            source = (f"read_json('{external}', format='newline_delimited', "
                      "columns={'task_id': 'VARCHAR', 'repeats': 'INTEGER'})")
        params = {"c": camp["campaign"], "p": camp["policy_id"]}
        expected_n = int(con.execute(f"SELECT coalesce(sum(repeats), 0) FROM {source}", params if own_plan else {}).fetchone()[0])
        mine = "SELECT task_id, attempt_index, status FROM attempts WHERE campaign = $c AND policy_id = $p"
        outside = "p.task_id IS NULL OR a.attempt_index >= p.repeats OR a.attempt_index < 0"
        found, errors, unexpected = con.execute(
            f"SELECT count(*), count(*) FILTER (WHERE a.status = 'system_error'), count(*) FILTER (WHERE {outside}) "
            f"FROM ({mine}) a LEFT JOIN {source} p ON p.task_id = a.task_id", params).fetchone()
        dups = con.execute(f"SELECT count(*) FROM ({mine}) GROUP BY task_id, attempt_index HAVING count(*) > 1", params).fetchall()
        missing = expected_n - (found - unexpected - sum(n - 1 for (n,) in dups))

        def keys(sql: str) -> list[tuple[str, int]]:  # fetched only for problems that exist
            return [(t, int(i)) for t, i in con.execute(sql + " ORDER BY 1, 2", params).fetchall()]

        return Validation(
            expected=expected_n, found=found,
            missing=keys(f"SELECT task_id, unnest(range(repeats)) FROM {source} EXCEPT SELECT task_id, attempt_index FROM ({mine})")
            if missing else [],
            unexpected=keys(f"SELECT a.task_id, a.attempt_index FROM ({mine}) a LEFT JOIN {source} p ON p.task_id = a.task_id "
                            f"WHERE {outside}") if unexpected else [],
            duplicates=keys(f"SELECT task_id, attempt_index FROM ({mine}) GROUP BY ALL HAVING count(*) > 1") if dups else [],
            system_errors=keys(f"SELECT task_id, attempt_index FROM ({mine}) WHERE status = 'system_error'") if errors else [],
        )
    finally:
        con.close()
        if external:
            os.unlink(external)


def checked_counts(path: Path | str, allow_incomplete: bool = False) -> Counts:
    """The run's per-task counts, refused in one line while the campaign is incomplete (unless allowed)."""
    run = RunDir(path).require()
    val = validate(run)
    if not val.ok and not allow_incomplete:
        raise UserError(f"{path}: campaign is incomplete ({val.reason()}); re-run the campaign to finish it, "
                        "or pass --allow-incomplete")
    return load_counts(run)
