"""A domain backend: typed SQLite tables in memory, one private copy per episode.

Why SQLite in memory, copied from a prepared template:
- real relational semantics (types, constraints, transactions) with no server to start;
- reset is `deserialize()` of a byte image built once per process (tens of microseconds), so
  the per-episode isolation unit is a connection, not a subprocess (the reference harness spawns
  fresh tool-server processes per attempt, ~1.5 s each);
- two episodes never share a connection, so they cannot see each other's writes, and tools
  only ever run parameterised statements on their own connection.

Tables are declared in Python (`Table`), including which columns are *volatile* free text that
the state hash ignores. Ids are text; new records get deterministic sequential ids.
"""
from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable, Iterable

from tbhpc.errors import PackError

SQL_TYPES = {"text": "TEXT", "int": "INTEGER", "real": "REAL", "bool": "INTEGER", "json": "TEXT"}


@dataclass(frozen=True)
class Column:
    name: str
    type: str = "text"          # text | int | real | bool | json
    default: Any = None

    def to_sql(self, value: Any) -> Any:
        if value is None:
            return None
        if self.type == "json":
            return json.dumps(value, sort_keys=True)
        if self.type == "bool":
            return 1 if value else 0
        return value

    def from_sql(self, value: Any) -> Any:
        if value is None:
            return None
        if self.type == "json":
            return json.loads(value)
        if self.type == "bool":
            return bool(value)
        if self.type == "real":
            return float(value)
        return value


@dataclass(frozen=True)
class Table:
    """A typed table. `volatile` columns are free text the state hash ignores."""

    name: str
    columns: tuple[Column, ...]
    volatile: frozenset[str] = frozenset()
    id_prefix: str = ""

    def __post_init__(self) -> None:
        if self.columns[0].name != "id":
            raise ValueError(f"table {self.name}: first column must be 'id'")

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)

    def col(self, name: str) -> Column:
        return self._by_name[name]

    @cached_property  # frozen dataclass: cached_property writes __dict__ directly, which is allowed
    def _by_name(self) -> dict[str, Column]:
        return {c.name: c for c in self.columns}

    def ddl(self) -> str:
        cols = ", ".join(
            f'"{c.name}" {SQL_TYPES[c.type]}' + (" PRIMARY KEY" if c.name == "id" else "")
            for c in self.columns
        )
        return f'CREATE TABLE "{self.name}" ({cols})'


def cols(spec: str, **types: str) -> tuple[Column, ...]:
    """`cols("id name price", price="real")` -> Columns; unnamed types default to text."""
    return tuple(Column(n, types.get(n, "text")) for n in spec.split())


@dataclass
class Backend:
    """One episode's private database. Tools receive it; nothing else shares it."""

    conn: sqlite3.Connection
    tables: dict[str, Table]
    today: str = "2025-01-01"
    meta: dict = field(default_factory=dict)

    # -- reads -----------------------------------------------------------------------------
    def get(self, table: str, row_id: Any) -> dict | None:
        t = self.tables[table]
        cur = self.conn.execute(f'SELECT * FROM "{table}" WHERE id = ?', (str(row_id),))
        row = cur.fetchone()
        return None if row is None else self._decode(t, row)

    def select(self, table: str, order: str = "id", **where: Any) -> list[dict]:
        t = self.tables[table]
        clauses = " AND ".join(f'"{k}" = ?' for k in where) or "1=1"
        args = [t.col(k).to_sql(v) for k, v in where.items()]
        rows = self.conn.execute(f'SELECT * FROM "{table}" WHERE {clauses}', args).fetchall()
        out = [self._decode(t, r) for r in rows]
        return sorted(out, key=lambda r: _id_key(r.get(order)))

    def all_rows(self, table: str) -> list[dict]:
        return self.select(table)

    # -- writes ----------------------------------------------------------------------------
    def next_id(self, table: str) -> str:
        """Deterministic sequential id: prefix + (row count + 1), skipping any taken value."""
        t = self.tables[table]
        n = self.conn.execute(f'SELECT COUNT(*) FROM "{table}"').fetchone()[0] + 1
        while self.get(table, f"{t.id_prefix}{n}") is not None:
            n += 1
        return f"{t.id_prefix}{n}"

    def insert(self, table: str, row: dict) -> dict:
        t = self.tables[table]
        row = dict(row)
        row["id"] = str(row["id"]) if row.get("id") is not None else self.next_id(table)
        full = {c.name: row.get(c.name, c.default) for c in t.columns}
        names = ", ".join(f'"{n}"' for n in full)
        marks = ", ".join("?" for _ in full)
        self.conn.execute(
            f'INSERT INTO "{table}" ({names}) VALUES ({marks})',
            [t.col(k).to_sql(v) for k, v in full.items()],
        )
        return full

    def update(self, table: str, row_id: Any, **changes: Any) -> dict:
        t = self.tables[table]
        if changes:
            sets = ", ".join(f'"{k}" = ?' for k in changes)
            args = [t.col(k).to_sql(v) for k, v in changes.items()] + [str(row_id)]
            self.conn.execute(f'UPDATE "{table}" SET {sets} WHERE id = ?', args)
        return self.get(table, row_id)

    def delete(self, table: str, row_id: Any) -> None:
        self.conn.execute(f'DELETE FROM "{table}" WHERE id = ?', (str(row_id),))

    def upsert(self, table: str, row: dict) -> None:
        """Patch semantics: merge the given fields onto an existing row, else insert."""
        if self.get(table, row["id"]) is None:
            self.insert(table, row)
        else:
            changes = {k: v for k, v in row.items() if k != "id"}
            self.update(table, row["id"], **changes)

    def apply_patch(self, patch: dict[str, list[dict]], file: str = "<patch>", task: str | None = None) -> None:
        for table, rows in patch.items():
            if table not in self.tables:
                raise PackError(file, f"unknown table {table!r}", task, f"init.data_patch.{table}")
            known = set(self.tables[table].column_names)
            for row in rows:
                bad = sorted(set(row) - known)
                if bad:
                    raise PackError(file, f"unknown column {bad[0]!r}", task, f"init.data_patch.{table}")
                self.upsert(table, row)

    @staticmethod
    def _decode(t: Table, row: Iterable[Any]) -> dict:
        return {c.name: c.from_sql(v) for c, v in zip(t.columns, row)}


def _id_key(value: Any) -> tuple:
    """Sort ids naturally: 'T2' before 'T10'."""
    text = "" if value is None else str(value)
    head = text.rstrip("0123456789")
    tail = text[len(head):]
    return (head, int(tail) if tail else -1, text)


def build_template(tables: Iterable[Table], seed: dict[str, list[dict]],
                   setup: "Callable[[sqlite3.Connection], None] | None" = None) -> bytes:
    """Create the tables, load the seed rows, run `setup` (e.g. a search index) and return
    the database as a byte image."""
    conn = sqlite3.connect(":memory:")
    tmap = {t.name: t for t in tables}
    for t in tmap.values():
        conn.execute(t.ddl())
    b = Backend(conn, tmap)
    for table, rows in seed.items():
        for row in rows:
            b.insert(table, row)
    if setup is not None:
        setup(conn)
    conn.commit()
    image = conn.serialize()
    conn.close()
    return image


def open_copy(image: bytes, tables: dict[str, Table], today: str) -> Backend:
    """A fresh private connection holding a copy of the template image."""
    conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
    conn.deserialize(image)
    return Backend(conn, tables, today=today)
