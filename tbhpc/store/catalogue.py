"""One SQL catalogue over every run under a folder: `tbhpc sql [ROOT] "SELECT ..."`.

Why: each run keeps its own `results.duckdb` (one writer per file, the merge). Comparing ten
policies should not mean attaching files by hand. The catalogue attaches every run database
under ROOT read-only, in an in-memory DuckDB, and defines union views with a `run` column (the
run's path relative to ROOT): `attempts`, `campaigns`, `tasks`, `plan`, `task_stats`, `blobs`,
`selections` and `train_steps` where runs have them. Runs of older schema versions join in with
NULL for the columns they lack (UNION ALL BY NAME).

Every query rescans ROOT, so a run added after the catalogue was opened is seen by the next
query. A run whose merge is writing at that moment holds DuckDB's write lock: the catalogue
retries its attach for `wait_s` (merges take seconds), then leaves that run out of the query and
says so (`Catalogue.skipped`), never blocking the writer.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import duckdb

from tbhpc.errors import UserError
from tbhpc.store.schema import task_stats_sql

TABLES = ("attempts", "campaigns", "tasks", "plan", "blobs", "selections", "train_steps")
DB_NAME = "results.duckdb"


def find_runs(root: Path) -> list[Path]:
    """Run databases under root (root itself may be a run), skipping hidden and quarantine folders."""
    root = Path(root)
    found = [p for p in root.rglob(DB_NAME) if not any(part.startswith(".") for part in p.relative_to(root).parts[:-1])]
    return sorted(found)


@dataclass
class Catalogue:
    root: Path
    wait_s: float = 10.0
    con: duckdb.DuckDBPyConnection = field(default_factory=lambda: duckdb.connect(":memory:"))
    attached: dict[Path, str] = field(default_factory=dict)      # database file -> alias
    skipped: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        if not self.root.exists():
            raise UserError(f"{self.root}: no such folder")

    def refresh(self) -> None:
        """Attach runs that appeared since the last query; rebuild the views."""
        self.skipped = []
        for db in find_runs(self.root):
            if db not in self.attached:
                alias = f"r{len(self.attached)}"
                if self._attach(db, alias):
                    self.attached[db] = alias
        self._views()

    def _attach(self, db: Path, alias: str) -> bool:
        deadline = time.monotonic() + self.wait_s
        while True:
            try:
                self.con.execute(f"ATTACH '{_esc(str(db))}' AS {alias} (READ_ONLY)")
                return True
            except duckdb.IOException as exc:
                if "lock" not in str(exc).lower() or time.monotonic() > deadline:
                    self.skipped.append(f"{self.name(db)}: {' '.join(str(exc).split())[:160]}")
                    return False
                time.sleep(0.2)

    def name(self, db: Path) -> str:
        rel = db.parent.relative_to(self.root)
        return str(rel) if str(rel) != "." else self.root.name

    def _views(self) -> None:
        for table in TABLES:
            parts = []
            for db, alias in self.attached.items():
                has = self.con.execute("SELECT count(*) FROM duckdb_tables() WHERE database_name = ? AND table_name = ? "
                                       "UNION ALL SELECT count(*) FROM duckdb_views() WHERE database_name = ? AND view_name = ?",
                                       [alias, table, alias, table]).fetchall()
                if sum(r[0] for r in has):
                    parts.append(f"SELECT '{_esc(self.name(db))}' AS run, * FROM {alias}.main.{table}")
            if parts:
                self.con.execute(f"CREATE OR REPLACE TEMP VIEW {table} AS " + " UNION ALL BY NAME ".join(parts))
            else:
                self.con.execute(f"DROP VIEW IF EXISTS {table}")
        # task_stats from the union views, per run (each run's own view would bind to those too)
        if self.attached:
            self.con.execute(f"CREATE OR REPLACE TEMP VIEW task_stats AS {task_stats_sql(per_run=True)}")

    def sql(self, query: str):
        self.refresh()
        if not self.attached:
            raise UserError(f"{self.root}: no run databases ({DB_NAME}) under it")
        try:
            return self.con.execute(query)
        except duckdb.Error as exc:
            raise UserError(f"sql: {' '.join(str(exc).split())[:400]}") from None

    def close(self) -> None:
        self.con.close()


def _esc(text: str) -> str:
    return text.replace("'", "''")


_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


def export_parquet(db: Path, out: Path) -> list[Path]:
    """Every table (and the task_stats view) of one run as `OUT/<table>.parquet`."""
    out.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect(str(db), read_only=True)
    written = []
    try:
        names = [r[0] for r in con.execute("SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main' "
                                           "UNION SELECT view_name FROM duckdb_views() WHERE schema_name = 'main' "
                                           "AND NOT internal ORDER BY 1").fetchall()]
        for name in names:
            path = out / f"{_SAFE.sub('_', name)}.parquet"
            con.execute(f"COPY (SELECT * FROM main.\"{name}\") TO '{_esc(str(path))}' (FORMAT parquet, COMPRESSION zstd)")
            written.append(path)
    finally:
        con.close()
    return written
