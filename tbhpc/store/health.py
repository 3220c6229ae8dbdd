"""Telling a damaged results file from a busy one, and saying how to get it back.

Why: `results.duckdb` is derived data: every attempt lives first in a shard (atomic JSONL files
under `shards/`), and the merge folds them in. Left to DuckDB, a damaged file ends a command in a
traceback, damage inside the file goes unnoticed until a query touches that block, and `tbhpc sql`
takes it for a file being written and waits. Here every results file a command opens
goes through `open_results`, so an error DuckDB raises later can be traced back to the damaged
file (`damage_error` re-reads each opened file to find it); `check_every_block` reads every
block that holds data (what `tbhpc validate` runs). Getting a damaged file back is the merge's
job (`merge.rebuild`).
"""
from __future__ import annotations

from pathlib import Path

import duckdb

from tbhpc.errors import UserError

# the messages DuckDB (1.x) gives a file whose bytes are wrong: a bad header, a block checksum,
# a file cut short
_DAMAGE = ("corrupt database file", "not a valid duckdb database file", "could not read enough bytes",
           "does not match stored checksum", "invalid block", "serialization error")
_BUSY = ("could not set lock", "conflicting lock")

_opened: list[Path] = []   # results files this process opened, newest last


class DamagedResults(UserError):
    """A results.duckdb whose bytes are wrong; its run's shards can rebuild it."""


def is_damage(exc: BaseException) -> bool:
    return isinstance(exc, duckdb.Error) and any(m in str(exc).lower() for m in _DAMAGE)


def is_busy(exc: BaseException) -> bool:
    return isinstance(exc, duckdb.Error) and any(m in str(exc).lower() for m in _BUSY)


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text.split(": ", 1)[1][:160] if text.startswith("IO Error: ") else text[:160]


def damaged(db: Path, exc: BaseException) -> DamagedResults:
    return DamagedResults(f"{db}: damaged ({_short(exc)}); the shards hold every attempt: rebuild it with "
                          f"`tbhpc merge {Path(db).parent} --rebuild`")


def open_results(db: Path | str, read_only: bool = True, config: dict | None = None,
                 files: bool = False) -> duckdb.DuckDBPyConnection:
    """duckdb.connect for a run's results file: damage is one line naming the file. A read-only
    connection is also sealed as `tbhpc sql`'s is (external access off, configuration locked)
    unless `files`: the caller reads or writes files through it (validate's key list, export)."""
    db = Path(db)
    if db in _opened:
        _opened.remove(db)
    _opened.append(db)
    try:
        con = duckdb.connect(str(db), read_only=read_only, config=config or {})
    except duckdb.Error as exc:
        if is_damage(exc):
            raise damaged(db, exc) from None
        raise
    if read_only and not files:
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
    return con


def attached_results(db: Path | str) -> duckdb.DuckDBPyConnection:
    """A sealed read-only connection to a results file that can stay open for long (an API user's
    relation): the file is ATTACHed to an in-memory database of its own, so the process's other
    connections to the same file (DuckDB shares one instance per path, configuration included)
    can still be opened as they need (`files=True` ones too)."""
    db = Path(db)
    con = duckdb.connect()
    try:
        from tbhpc.store.sqltext import literal
        con.execute(f"ATTACH {literal(str(db))} AS results (READ_ONLY)")
    except duckdb.Error as exc:
        con.close()
        if is_damage(exc):
            raise damaged(db, exc) from None
        raise
    con.execute("USE results")
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")
    return con


def check_every_block(con: duckdb.DuckDBPyConnection, db: Path | str) -> int:
    """Read every column of every table (each block's checksum is verified as it is read);
    returns the rows read. Damage raises DamagedResults naming `db`."""
    rows = 0
    try:
        tables = [r[0] for r in con.execute("SELECT table_name FROM duckdb_tables() WHERE database_name = "
                                            "current_database() ORDER BY 1").fetchall()]
        for table in tables:   # hashing every column makes DuckDB read (and checksum) each block
            rows += con.execute(f'SELECT count(*), max(hash(COLUMNS(*))) FROM main."{table}"').fetchone()[0]
    except duckdb.Error as exc:
        if is_damage(exc):
            raise damaged(Path(db), exc) from None
        raise
    return rows


def damage_error(exc: BaseException) -> DamagedResults:
    """A damage error DuckDB raised in the middle of a command: find which opened file it was."""
    return find_damaged(list(reversed(_opened)), exc)


def find_damaged(candidates: list[Path], exc: BaseException) -> DamagedResults:
    """The first of `candidates` that is damaged, read block by block (else a line listing them)."""
    for db in candidates:
        try:
            con = duckdb.connect(str(db), read_only=True)
        except duckdb.Error as err:
            if is_damage(err):
                return damaged(db, err)
            continue
        try:
            check_every_block(con, db)
        except DamagedResults as found:
            return found
        except duckdb.Error:
            continue
        finally:
            con.close()
    where = f" (one of: {', '.join(map(str, candidates))})" if candidates else ""
    return DamagedResults(f"a results file is damaged ({_short(exc)}){where}; rebuild it with "
                          f"`tbhpc merge RUN --rebuild`")
