"""Transcripts: every attempt's conversation, stored with its row; the bulky shared parts by reference.

Why in the attempt row (`attempts.transcript`, compact JSON) rather than a store of its own: it
is then written atomically with the shard, replaced by key on a re-run and quarantined with a
corrupt shard exactly like every other field of the attempt; and DuckDB stores columns apart, so
`agg`, `select` and every query that never names the column never read it.

Why references: the system prompt (agent prompt + domain instructions) and the tool schemas are
the same for every attempt of a scenario and would be most of every transcript. Each is written
once per run as a content-addressed file `blobs/<sha256[:16]>.json` (any worker may write it; the
same name always holds the same bytes) and loaded into the `blobs` table by the merge.

The document (version 1):
    {"v": 1, "system": REF | null, "tools": REF | null, "messages": [...after the system message...],
     "finish": FINISH_REASON, "judge": [{"question", "yes"}, ...]}
A document with `"format": "thinkingbox"` (written by `import-tb`) keeps the reference harness's
own messages, system messages and tool definitions; `expand` converts them on reading.
Messages keep their OpenAI-style shape: assistant `content`, `reasoning`, `tool_calls` (id,
function name, JSON arguments); tool `tool_call_id`, `name`, `content`; user `content`.
"""
from __future__ import annotations

import hashlib
import json
import os
import uuid
from pathlib import Path
from typing import Any, Callable

VERSION = 1


def blob_ref(value: Any) -> tuple[str, str]:
    text = json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16], text


_KNOWN: dict[tuple[int, str], tuple[Any, str]] = {}   # (id(value), dir) -> (value, ref): a value object seen before


def put_blob(blob_dir: Path, value: Any) -> str:
    """Write `value` once under its content hash; returns the reference. The same object (a
    domain's tool list is one list for every attempt) is hashed and checked on disk only once per
    process; the entry holds the object, so its id cannot be reused by another while cached."""
    key = (id(value), str(blob_dir))
    hit = _KNOWN.get(key)
    if hit is not None and hit[0] is value:
        return hit[1]
    ref, text = blob_ref(value)
    path = Path(blob_dir) / f"{ref}.json"
    if len(_KNOWN) > 1024:
        _KNOWN.clear()
    _KNOWN[key] = (value, ref)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".tmp-{uuid.uuid4().hex}-{ref}.json")   # unique per writer: threads share a pid
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)                                          # same name, same bytes: the last rename wins
    return ref


def compact(messages: list[dict], tools: list[dict], finish: str, judge: list[dict], blob_dir: Path | None) -> str:
    """The attempt's transcript document as JSON text (system prompt and tools by reference when
    `blob_dir` is given, else inline)."""
    system = messages[0]["content"] if messages and messages[0].get("role") == "system" else None
    rest = messages[1:] if system is not None else messages
    doc: dict[str, Any] = {"v": VERSION}
    if blob_dir is None:
        doc.update(system_text=system, tools_inline=tools or None)
    else:
        doc.update(system=put_blob(blob_dir, system) if system is not None else None,
                   tools=put_blob(blob_dir, tools) if tools else None)
    doc.update(messages=rest, finish=finish, judge=judge or [])
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":"))


def shortened(text: str, limit: int) -> str:
    """The transcript of an attempt too long for a shard line: its references, finish and judge
    verdicts kept, its messages replaced by one `note` message that says what was left out."""
    doc = json.loads(text)
    n = len(doc.get("messages", []))
    note = (f"{n} message{'' if n == 1 else 's'} ({len(text.encode('utf-8')):,} bytes) left out: "
            f"an attempt's row may take at most {limit:,} bytes")
    return json.dumps({**doc, "messages": [{"role": "note", "content": note}]}, ensure_ascii=False, separators=(",", ":"))


def expand(text: str, blob: Callable[[str], str | None]) -> dict:
    """The full transcript: {messages (system first), tools, finish, judge}. `blob(ref)` gives a
    blob's JSON text (None if it is missing: the reference is then kept, marked unresolved)."""
    doc = json.loads(text)
    if doc.get("v") != VERSION:
        raise ValueError(f"transcript version {doc.get('v')!r} is not {VERSION}")

    def resolve(ref: str | None) -> Any:
        if ref is None:
            return None
        raw = blob(ref)
        return json.loads(raw) if raw is not None else {"unresolved_blob": ref}

    if doc.get("format") == "thinkingbox":     # imported from the reference harness
        from tbhpc.store import tb_transcripts as tb
        system, tools = resolve(doc.get("system")), resolve(doc.get("tools"))
        system = system if isinstance(system, list) else ([{"content": f"(missing blob {doc['system']})"}] if system else None)
        return {"messages": tb.to_messages(system, doc["messages"]),
                "tools": tb.to_tools(tools) if isinstance(tools, list) else [], "finish": doc.get("finish", ""),
                "judge": tb.to_judge(doc.get("judge"))}
    system = doc["system_text"] if "system_text" in doc else resolve(doc.get("system"))
    tools = doc["tools_inline"] if "tools_inline" in doc else resolve(doc.get("tools"))
    messages = ([{"role": "system", "content": system}] if system is not None else []) + doc["messages"]
    return {"messages": messages, "tools": tools or [], "finish": doc.get("finish", ""), "judge": doc.get("judge", [])}


def read_attempt(db: Path, task_id: str, attempt: int | None = None, policy: str | None = None) -> dict:
    """One attempt row of a run (with `transcript` expanded), read-only. Default attempt: the task's
    first failed one if it has any, else its first. A missing task or attempt is a UserError."""
    import duckdb

    from tbhpc.errors import UserError
    from tbhpc.store.health import open_results
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
