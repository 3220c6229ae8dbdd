"""One attempt of a run, read back with its transcript: what `tbhpc show` and `api.show` print.

Why here and not in the transcript codec: this is a query on the results database (which row,
which policy, the blobs it references); `transcripts.expand` stays a pure function of the text.
"""
from __future__ import annotations

import json
from pathlib import Path

from tbhpc.errors import UserError
from tbhpc.store.health import open_results
from tbhpc.store.transcripts import expand


def read_attempt(db: Path, task_id: str, attempt: int | None = None, policy: str | None = None) -> dict:
    """One attempt row of a run (with `transcript` expanded), read-only. Default attempt: the task's
    first failed one if it has any, else its first. A missing task or attempt is a UserError."""
    con = open_results(db, read_only=True)
    try:
        where, params = "task_id = ?", [task_id]
        if policy is not None:
            where, params = where + " AND policy_id = ?", params + [policy]
        keys = con.execute(f"SELECT attempt_index, passed, policy_id FROM attempts WHERE {where} "
                           "ORDER BY attempt_index, finished_at DESC", params).fetchall()
        if not keys:
            n = con.execute("SELECT count(DISTINCT task_id) FROM attempts").fetchone()[0]
            raise UserError(f"{db.parent}: no attempt of task {task_id!r}"
                            + (f" by policy {policy!r}" if policy else "") + f" ({n} tasks in this run)")
        indexes = sorted({k[0] for k in keys})
        if attempt is None:
            failed = [k[0] for k in keys if k[1] is not True]
            attempt = failed[0] if failed else indexes[0]
        elif attempt not in indexes:
            raise UserError(f"{db.parent}: task {task_id!r} has attempts {_ranges(indexes)}; no attempt {attempt}")
        cur = con.execute(f"SELECT * FROM attempts WHERE {where} AND attempt_index = ? ORDER BY finished_at DESC",
                          params + [attempt])
        names = [d[0] for d in cur.description]
        rows = cur.fetchall()
        row = dict(zip(names, rows[0]))
        row["other_policies"] = len(rows) - 1
        text = row.pop("transcript", None)
        blobs = {}
        if text:
            doc = json.loads(text)
            refs = [r for r in (doc.get("system"), doc.get("tools")) if r]
            if refs:
                blobs = dict(con.execute(f"SELECT ref, content FROM blobs WHERE ref IN ({', '.join('?' * len(refs))})",
                                         refs).fetchall())
    finally:
        con.close()
    row["transcript"] = expand(text, blobs.get) if text else None
    return row


def _ranges(values: list[int]) -> str:
    out, start = [], None
    for i, v in enumerate(values):
        if start is None:
            start = v
        if i + 1 == len(values) or values[i + 1] != v + 1:
            out.append(f"{start}" if start == v else f"{start}-{v}")
            start = None
    return ", ".join(out)
