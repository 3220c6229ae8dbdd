"""Merge shards into `results.duckdb`: incremental, idempotent, tolerant of corrupt shards.

- Only shards not yet merged are read (the `merged_shards` table remembers names).
- The first merge of a run goes straight into `attempts` in one transaction when its rows are
  valid and its keys unique (the common case: a whole campaign, an ingest); anything else takes
  the staged path below.
- All new shards are read in one DuckDB scan; if that fails, each is read alone to find the bad
  ones. A corrupt or truncated shard is moved to `shards/quarantine/`, recorded with its error,
  and reported in one line naming it; the other shards still merge, and the quarantined shard's
  keys count as missing (a re-run executes them again).
- A damaged results file is moved aside and every shard merged again (`rebuild`).
- One row per attempt key: an `ok` result is never replaced by a later system error; otherwise
  the newest result wins. Re-merging changes nothing.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import duckdb

from tbhpc.errors import InfraError
from tbhpc.store.health import check_every_block, open_results
from tbhpc.store.run_dir import RunDir
from tbhpc.store.schema import ATTEMPT_COLUMNS, DDL, KEY, SHARD_COLUMNS
from tbhpc.store.shards import MAX_SHARD_LINE, list_shards
from tbhpc.store.sqltext import literal, literal_list

# A new results.duckdb is written in the newest storage format: its string compression (FSST over
# dictionaries) stores transcripts in ~0.3x their JSON size, where the default (compatible with
# DuckDB 0.10) stores them uncompressed. Every tbhpc environment pins the same DuckDB version.
WRITE_CONFIG = {"storage_compatibility_version": "latest"}

# A merge's working memory: DuckDB spills to `<results.duckdb>.tmp/` beyond it, so a million-row
# ingest stays near 200 MiB resident instead of growing with the run. The JSON reader's buffers
# (two lines' worth per thread) come out of the same budget: hence the line limit.
MERGE_MEMORY = "160MB"

_READ = ("read_json({files}, format='newline_delimited', columns={columns}, filename=true, "
         f"maximum_object_size={MAX_SHARD_LINE})")


# a row that cannot land: part of its key missing, or a status the metrics do not know
_INVALID = " OR ".join(f"{k} IS NULL" for k in KEY) + " OR status NOT IN ('ok', 'system_error')"

_READ_PLAN = ("read_json({path}, format='newline_delimited', columns={{'task_id': 'VARCHAR', 'domain': 'VARCHAR', "
              "'split': 'VARCHAR', 'n_golden_calls': 'INTEGER', 'tags': 'VARCHAR[]', 'template': 'VARCHAR', 'repeats': 'INTEGER'}})")


@dataclass
class MergeReport:
    new_shards: int = 0
    rows: int = 0
    quarantined: list[tuple[str, str]] = field(default_factory=list)

    def lines(self) -> list[str]:
        return [f"shard {name} is corrupt ({err}); moved to shards/quarantine/, its attempts will re-run"
                for name, err in self.quarantined]


def insert_rows(con, table: str, rows: list[dict], columns: dict[str, str], replace: bool = False) -> None:
    """Bulk insert through a temporary JSONL file (DuckDB's executemany goes row by row)."""
    if not rows:
        return
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False, encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, default=str) + "\n")
    try:
        cols = "{" + ", ".join(f"'{c}': '{t}'" for c, t in columns.items()) + "}"
        verb = "INSERT OR REPLACE" if replace else "INSERT"
        con.execute(f"{verb} INTO {table} SELECT {', '.join(columns)} FROM "
                    f"read_json({literal(f.name)}, format='newline_delimited', columns={cols})")
    finally:
        os.unlink(f.name)


def connect(run: RunDir, read_only: bool = False, files: bool = False) -> duckdb.DuckDBPyConnection:
    """`read_only`: sealed (no files read or written through it) unless `files` (health.open_results)."""
    if read_only:
        return open_results(run.db, read_only=True, files=files)
    con = open_results(run.db, read_only=False, config=WRITE_CONFIG)
    con.execute("SET enable_progress_bar = false")
    con.execute(DDL)
    return con


def merge(run: RunDir, verify: bool = False) -> MergeReport:
    """`verify`: first read every block of an existing results file (read-only), so a damaged one
    is reported before anything is written into it (tbhpc.store.health)."""
    report = MergeReport()
    with run.lock():
        if verify and run.db.exists():
            con = connect(run, read_only=True)
            try:
                check_every_block(con, run.db)
            finally:
                con.close()
        con = connect(run)
        try:
            con.execute(f"SET memory_limit = '{MERGE_MEMORY}'")
            con.execute("SET preserve_insertion_order = false")   # rows are found by key, never by position
            _load_metadata(con, run)
            _load_blobs(con, run)
            done = {r[0] for r in con.execute("SELECT shard FROM merged_shards").fetchall()}
            new = [p for p in list_shards(run.shards) if p.name not in done]
            con.execute(f"SET threads = {_threads_for(new)}")
            report.new_shards = len(new)
            if new and _direct(con, new):
                report.rows = con.execute("SELECT count(*) FROM attempts").fetchone()[0]
                return report
            good = _stage(con, new, run, report)
            if good:
                con.execute("BEGIN TRANSACTION")  # all of a merge lands, or none of it
                con.execute("INSERT OR REPLACE INTO merged_shards SELECT shard, count(*), now() FROM staging GROUP BY shard")
                report.rows = _upsert(con)
                con.execute("COMMIT")
        except duckdb.Error as exc:
            _raise_if_resource(exc, list_shards(run.shards))
            raise
        finally:
            con.close()
    return report


def _threads_for(shards: list[Path]) -> int:
    """Two threads, unless rows are kilobytes (transcripts): each thread then keeps a partial row
    group of them in memory, which two threads overflow the budget with, where one stays ~250 MiB
    (measured on 300,000 attempts with 2.9 KB transcripts). Judged from the first new shard."""
    if not shards:
        return 2
    with open(shards[0], "rb") as f:
        data = f.read()
    return 1 if len(data) > 1024 * max(1, data.count(b"\n")) else 2


def _load_blobs(con, run: RunDir) -> None:
    """Transcript parts written since the last merge (a workers writes its blobs before its shard)."""
    have = {r[0] for r in con.execute("SELECT ref FROM blobs").fetchall()}
    new = [p for p in sorted(run.blobs.glob("*.json")) if not p.name.startswith(".") and p.stem not in have]
    if new:
        con.execute(f"INSERT OR IGNORE INTO blobs SELECT regexp_extract(filename, '([^/]+)[.]json$', 1), content "
                    f"FROM read_text({literal_list(new)})")


def _direct(con, files: list[Path]) -> bool:
    """The first merge of a run (empty `attempts`, e.g. a whole campaign's shards or an ingest):
    straight into `attempts` in one transaction, if every row is valid and no key comes twice.
    Otherwise it is rolled back and returns False: the staged path sorts out duplicates and
    quarantines bad shards. Half the copying of the staged path for the common case."""
    if con.execute("SELECT count(*) FROM attempts").fetchone()[0]:
        return False
    con.execute("BEGIN TRANSACTION")
    try:
        _insert(con, files, table="attempts")
        key = ", ".join(KEY)
        # a key twice (or, once in ~10^10 merges of a million rows, two keys with one 64-bit hash):
        # the staged path, which sorts duplicates out exactly. Half the time of grouping by the key;
        # invalid rows are counted in the same scan.
        dup, invalid = con.execute(f"SELECT count(*) - count(DISTINCT hash({key})), count(*) FILTER (WHERE {_INVALID}) "
                                   "FROM attempts").fetchone()
        if dup or invalid:
            con.execute("ROLLBACK")
            return False
        con.execute("INSERT OR REPLACE INTO merged_shards SELECT shard, count(*), now() FROM attempts GROUP BY shard")
        con.execute("COMMIT")
        return True
    except duckdb.Error as exc:
        con.execute("ROLLBACK")
        _raise_if_resource(exc, files)
        return False


def _stage(con, files: list[Path], run: RunDir, report: MergeReport) -> int:
    """Load the new shards into a temp `staging` table; returns how many shards were good."""
    con.execute(f"CREATE OR REPLACE TEMP TABLE staging ({', '.join(f'{c} {t}' for c, t in ATTEMPT_COLUMNS.items())})")
    if not files:
        return 0
    try:  # fast path: one scan over every new shard
        _insert(con, files)
        if not _invalid_rows(con):
            return len(files)
    except duckdb.Error as exc:
        _raise_if_resource(exc, files)
    con.execute("DELETE FROM staging")
    good = 0
    for p in files:  # slow path: find the bad shards one by one
        try:
            _insert(con, [p])
            problem = _invalid_rows(con, p.name)
            if problem:
                raise ValueError(problem)
            good += 1
        except (duckdb.Error, ValueError) as exc:
            _raise_if_resource(exc, [p])
            con.execute(f"DELETE FROM staging WHERE shard = {literal(p.name)}")
            msg = " ".join(str(exc).split())[:200]
            run.quarantine.mkdir(parents=True, exist_ok=True)
            shutil.move(str(p), run.quarantine / p.name)
            con.execute(f"INSERT OR REPLACE INTO quarantined_shards VALUES ({literal(p.name)}, {literal(msg)}, now())")
            report.quarantined.append((p.name, msg))
    return good


def _raise_if_resource(exc: BaseException, files: list[Path]) -> None:
    """Running out of memory or disk says nothing about a shard: stop, and quarantine nothing."""
    if isinstance(exc, (duckdb.OutOfMemoryException, duckdb.IOException)):
        where = files[0].parent if files else "shards"
        raise InfraError(f"merge of {len(files)} shard(s) in {where} stopped, nothing was merged or quarantined",
                         exc) from None


def _insert(con, files: list[Path], table: str = "staging") -> None:
    names = literal_list(files)
    cols = ", ".join(SHARD_COLUMNS)
    con.execute(f"INSERT INTO {table} BY NAME SELECT {cols}, regexp_extract(filename, '[^/]+$') AS shard "
                f"FROM {_READ.format(files=names, columns=_columns())}")


def _columns() -> str:
    return "{" + ", ".join(f"'{c}': '{t}'" for c, t in SHARD_COLUMNS.items()) + "}"


def _invalid_rows(con, shard: str | None = None, table: str = "staging") -> str | None:
    where = f"WHERE {_INVALID}" if shard is None else f"WHERE shard = {literal(shard)} AND ({_INVALID})"
    n = con.execute(f"SELECT count(*) FROM {table} {where}").fetchone()[0]
    return f"{n} row(s) without a full attempt key or with an unknown status" if n else None


def _upsert(con) -> int:
    """Replace-by-key from `staging` into `attempts` (one row per key afterwards)."""
    key = ", ".join(KEY)
    dup = con.execute(f"SELECT count(*) FROM (SELECT 1 FROM staging GROUP BY {key} HAVING count(*) > 1)").fetchone()[0]
    fresh = "staging"
    if dup:  # the same key in several new shards: an ok result wins, then the newest
        con.execute(f"""CREATE OR REPLACE TEMP TABLE fresh AS SELECT * FROM staging QUALIFY row_number() OVER (
                        PARTITION BY {key} ORDER BY (status = 'ok') DESC, finished_at DESC, shard DESC) = 1""")
        fresh = "fresh"
    on = " AND ".join(f"a.{k} = f.{k}" for k in KEY)
    # never replace an ok result by a later system error (in place: copying a million rows costs seconds)
    con.execute(f"DELETE FROM {fresh} f WHERE f.status <> 'ok' AND EXISTS (SELECT 1 FROM attempts a WHERE {on} AND a.status = 'ok')")
    con.execute(f"DELETE FROM attempts a WHERE EXISTS (SELECT 1 FROM {fresh} f WHERE {on})")
    con.execute(f"INSERT INTO attempts BY NAME SELECT * FROM {fresh}")   # by name: older files got new columns appended
    return con.execute(f"SELECT count(*) FROM {fresh}").fetchone()[0]


def _load_metadata(con, run: RunDir) -> None:
    """Campaign row, tasks and plan, once per run (a run's plan never changes: its identity is
    checked when it is resumed). The campaign row is written last and marks the load complete."""
    camp = run.campaign()
    name = literal(camp["campaign"])
    if con.execute(f"SELECT count(*) FROM campaigns WHERE campaign = {name}").fetchone()[0]:
        return
    plan = _READ_PLAN.format(path=literal(run.plan_file))
    con.execute("BEGIN TRANSACTION")
    con.execute(f"DELETE FROM tasks WHERE campaign = {name}")
    con.execute(f"DELETE FROM plan WHERE campaign = {name}")
    con.execute(f"INSERT INTO tasks SELECT {name}, task_id, domain, split, n_golden_calls, tags, template FROM {plan}")
    con.execute(f"INSERT INTO plan SELECT {name}, task_id, {literal(camp.get('policy_id'))}, repeats FROM {plan}")
    insert_campaign(con, camp)
    con.execute("COMMIT")


def insert_campaign(con, camp: dict) -> None:
    """The campaign row from campaign.json's fields (written last: it marks a complete load)."""
    values = [camp["campaign"], camp.get("kind"), camp.get("policy_id"), camp.get("config_hash"),
              json.dumps(camp.get("config", {})), camp.get("created_at"), camp.get("source", "tbhpc")]
    con.execute(f"INSERT INTO campaigns VALUES ({', '.join(literal(v) for v in values)})")


def rebuild(run) -> tuple[Path | None, object]:
    """Move RUN/results.duckdb aside (kept, as results.duckdb.damaged-TIME) and merge every shard
    into a new one (a training run's steps come back from its log: tbhpc.train.record.restore_steps).
    Returns (where the old file went, the merge report)."""
    aside = None
    with run.lock():
        if run.db.exists():
            aside = run.db.with_name(f"{run.db.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}")
            run.db.rename(aside)
            wal = run.db.with_name(run.db.name + ".wal")
            if wal.exists():
                wal.rename(aside.with_name(aside.name + ".wal"))
    return aside, merge(run)
