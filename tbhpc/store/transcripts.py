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

import json
from pathlib import Path
from typing import Any, Callable

from tbhpc.store import tb_transcripts as tb
from tbhpc.store.blobs import put_blob

VERSION = 1


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
        system, tools = resolve(doc.get("system")), resolve(doc.get("tools"))
        system = system if isinstance(system, list) else ([{"content": f"(missing blob {doc['system']})"}] if system else None)
        return {"messages": tb.to_messages(system, doc["messages"]),
                "tools": tb.to_tools(tools) if isinstance(tools, list) else [], "finish": doc.get("finish", ""),
                "judge": tb.to_judge(doc.get("judge"))}
    system = doc["system_text"] if "system_text" in doc else resolve(doc.get("system"))
    tools = doc["tools_inline"] if "tools_inline" in doc else resolve(doc.get("tools"))
    messages = ([{"role": "system", "content": system}] if system is not None else []) + doc["messages"]
    return {"messages": messages, "tools": tools or [], "finish": doc.get("finish", ""), "judge": doc.get("judge", [])}
