"""Small helpers shared by test modules (pytest puts tests/ on sys.path)."""
from pathlib import Path

import duckdb


def attempt_rows(run: Path) -> list[tuple]:
    """(task_id, attempt_index, reward, status) of a run, sorted by key."""
    con = duckdb.connect(str(run / "results.duckdb"), read_only=True)
    try:
        return con.execute("SELECT task_id, attempt_index, reward, status FROM attempts ORDER BY 1, 2").fetchall()
    finally:
        con.close()
