"""The reference harness's conversations (`DecodeResult.messages`) as tbhpc transcripts.

Two halves, one format:
- Writing (`import-tb`): each result line's messages become a transcript document (`"format":
  "thinkingbox"`) that keeps the reference messages as they are, with the leading system messages
  and the tool definitions moved out to the run's `blobs` table by content hash, exactly like
  tbhpc's own transcripts.
- Reading (`tbhpc show`, the failure browser): the reference messages become tbhpc's OpenAI-style
  messages, so one renderer serves both.

Why the writing half is Python streaming a line at a time, when the rest of import-tb is one
DuckDB pass: DuckDB works on vectors of 2,048 rows, and its JSON functions hold a parsed document
per row, so splitting transcripts in SQL holds thousands of parsed conversations at once; a line
at a time holds one. It writes a reduced copy of the file (the fields the SQL pass reads, plus
the finished transcript), which the same SQL pass then imports. Files without messages
(metadata-only) never reach this half.

Reference message types (thinkingbox.common.chat_types): Text (role, content, metadata.tag
think|text|direct, metadata.is_dummy), ToolCall (name, arguments, id, metadata.error),
ParallelToolCall (tool_calls), ToolResponse (name, content, id, metadata.direct_response).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tbhpc.store.blobs import blob_ref

FORMAT = "thinkingbox"


def reference_doc(result: dict, blobs: dict[str, str]) -> dict | None:
    """The transcript document of one DecodeResult (None when it has no messages); its leading
    system messages and its tool definitions go to `blobs` (ref -> JSON text) by content hash."""
    messages = result.get("messages")
    if not isinstance(messages, list) or not messages:
        return None
    n_system = 0
    while n_system < len(messages) and _is_system(messages[n_system]):
        n_system += 1
    doc: dict[str, Any] = {"v": 1, "format": FORMAT, "system": _blob(messages[:n_system], blobs),
                           "tools": _blob(result.get("tools"), blobs), "messages": messages[n_system:],
                           "finish": result.get("finish_reason", "done")}
    test = result.get("test_result")
    judge = (test.get("metadata") or {}).get("judge_motivation") if isinstance(test, dict) else None
    doc["judge"] = judge if isinstance(judge, list) else []
    return doc


def _is_system(m: Any) -> bool:
    return isinstance(m, dict) and m.get("T") == "Text" and m.get("role") == "system"


def _blob(value: Any, blobs: dict[str, str]) -> str | None:
    if not value:
        return None
    ref, text = blob_ref(value)
    blobs.setdefault(ref, text)
    return ref


# The fields import-tb's SQL reads from a result line; everything else is left out of the reduced copy.
_KEPT = ("uid", "finish_reason", "is_system_error", "test_result", "usage", "metadata", "error")


def write_reduced(files: list[Path], out: Path, exact: bool = False) -> dict[str, str]:
    """Stream the result files (one line in memory at a time) into `out`: per line, the fields the
    SQL pass reads plus `transcript` (the document, as a JSON object) in place of the bulky
    messages, tool definitions, test context and raw histories. Returns the blobs (ref -> JSON
    text). A line that is not JSON stops it with its file and line number, and with `exact` so
    does a line whose fields are not of the reference's types (tbhpc.store.tb_types)."""
    from tbhpc.errors import UserError
    from tbhpc.store.tb_types import inexact_message, parsed_lines, type_problem
    blobs: dict[str, str] = {}
    with open(out, "w", encoding="utf-8", errors="replace") as sink:   # a lone surrogate (an escaped \ud800) -> "?"
        for f, no, result, problem in parsed_lines(files):
            if problem or exact and (problem := type_problem(result)):
                raise UserError(inexact_message(f, no, problem))
            doc = reference_doc(result, blobs)
            reduced = {k: result[k] for k in _KEPT if k in result}
            if isinstance(reduced.get("test_result"), dict):
                reduced["test_result"] = {k: v for k, v in reduced["test_result"].items() if k != "metadata"}
            if isinstance(reduced.get("metadata"), dict):
                reduced["metadata"] = {k: v for k, v in reduced["metadata"].items() if k in ("scenario", "error")}
            reduced["transcript"] = doc
            sink.write(json.dumps(reduced, ensure_ascii=False, separators=(",", ":")) + "\n")
    return blobs


# ---- reading back: reference messages -> tbhpc's OpenAI-style messages ----------------------

def to_messages(system: list[dict] | None, messages: list[dict]) -> list[dict]:
    """The reference conversation as tbhpc messages: one system message (the reference's leading
    system messages joined, as Qwen templates see them), user/assistant text, reasoning on the
    assistant message that follows it, tool calls with JSON arguments, tool outputs."""
    out: list[dict] = []
    if system:
        out.append({"role": "system", "content": "\n\n".join(str(m.get("content", "")) for m in system)})
    reasoning: list[str] = []

    def assistant(**fields) -> None:
        if reasoning:
            fields["reasoning"] = "\n".join(reasoning)
            reasoning.clear()
        out.append({"role": "assistant", **fields})

    for m in messages:
        kind, meta = m.get("T"), m.get("metadata") or {}
        if kind == "Text":
            if meta.get("is_dummy"):
                continue
            if m.get("role") == "assistant" and meta.get("tag") == "think":
                reasoning.append(str(m.get("content", "")))
            elif m.get("role") == "assistant":
                assistant(content=m.get("content", ""))
            else:
                out.append({"role": m.get("role", "user"), "content": m.get("content", "")})
        elif kind in ("ToolCall", "ParallelToolCall"):
            calls = m.get("tool_calls") if kind == "ParallelToolCall" else [m]
            assistant(content="", tool_calls=[_call(c) for c in calls or []])
        elif kind == "ToolResponse":
            out.append({"role": "tool", "tool_call_id": m.get("id"), "name": m.get("name"), "content": m.get("content", "")})
            direct = meta.get("direct_response")
            if direct is not None:
                assistant(content=direct)
        else:
            out.append({"role": "note", "content": json.dumps(m, ensure_ascii=False)})
    if reasoning:
        assistant(content="")
    return out


def _call(c: dict) -> dict[str, Any]:
    call = {"id": c.get("id"), "type": "function",
            "function": {"name": c.get("name"), "arguments": json.dumps(c.get("arguments", {}), ensure_ascii=False)}}
    error = (c.get("metadata") or {}).get("error")
    if error:
        call["error"] = error
    return call


def to_tools(tools: list[dict] | None) -> list[dict]:
    """ToolDef (name, description, input_schema) -> the OpenAI function-tool shape tbhpc shows."""
    return [{"type": "function", "function": {"name": t.get("name"), "description": t.get("description", ""),
                                              "parameters": t.get("input_schema", {})}} for t in tools or []]


def to_judge(motivations: list[dict] | None) -> list[dict]:
    return [{"question": j.get("question", ""), "yes": bool(j.get("answer")), "motivation": j.get("motivation", "")}
            for j in motivations or []]
