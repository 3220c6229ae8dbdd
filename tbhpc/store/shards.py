"""Shard files: JSON Lines, one attempt per line, written atomically.

A shard is written to a hidden temp file in the same directory, flushed and fsync'ed, then
renamed into place: a reader sees the whole shard or nothing, even if the writer is killed with
SIGKILL mid-write. Shard names carry the writer (host, pid, a counter) so writers never collide.
"""
from __future__ import annotations

import itertools
import json
import os
import socket
import uuid
from datetime import datetime
from pathlib import Path
from typing import Iterable

from tbhpc.store.schema import SHARD_COLUMNS
from tbhpc.store.transcripts import shortened

_COUNTER = itertools.count()
# The merge reads lines up to this size (its memory budget holds two per thread); a longer row
# keeps everything but its transcript's messages, which become a note saying what was left out.
MAX_SHARD_LINE = 16 << 20


def shard_name(prefix: str = "shard") -> str:
    host = socket.gethostname().split(".")[0]
    return f"{prefix}-{host}-{os.getpid()}-{next(_COUNTER):05d}-{uuid.uuid4().hex[:8]}.jsonl"


def write_shard(shard_dir: Path, rows: Iterable[dict], name: str | None = None) -> Path:
    """Write rows atomically; returns the final path. Unknown keys are an error (schema drift)."""
    shard_dir = Path(shard_dir)
    shard_dir.mkdir(parents=True, exist_ok=True)
    final = shard_dir / (name or shard_name())
    tmp = shard_dir / f".tmp-{final.name}"
    with open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            extra = set(row) - set(SHARD_COLUMNS)
            if extra:
                raise ValueError(f"attempt row has unknown fields {sorted(extra)}")
            f.write(_line(row))
            f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, final)
    return final


def _line(row: dict) -> str:
    line = json.dumps(row, ensure_ascii=False, default=_default, separators=(",", ":"))
    if len(line) * 4 > MAX_SHARD_LINE and len(line.encode("utf-8")) > MAX_SHARD_LINE and row.get("transcript"):
        row = {**row, "transcript": shortened(row["transcript"], MAX_SHARD_LINE)}
        line = json.dumps(row, ensure_ascii=False, default=_default, separators=(",", ":"))
    return line


def list_shards(shard_dir: Path) -> list[Path]:
    """Completed shards only (temp files start with '.')."""
    shard_dir = Path(shard_dir)
    if not shard_dir.is_dir():
        return []
    return sorted(p for p in shard_dir.glob("*.jsonl") if not p.name.startswith("."))


def _default(value):
    if isinstance(value, datetime):
        return value.isoformat(sep=" ")
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
