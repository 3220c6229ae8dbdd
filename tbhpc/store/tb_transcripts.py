"""The reference harness's conversations (`DecodeResult.messages`) as tbhpc transcripts.

Two halves, one format:
- SQL, used by `import-tb` inside its single DuckDB pass: each result line's messages become a
  transcript document (`"format": "thinkingbox"`) that keeps the reference messages as they are,
  with the leading system messages and the tool definitions moved out to the run's `blobs` table
  by content hash, exactly like tbhpc's own transcripts. Nothing is parsed in Python per line, so
  a result file of gigabytes imports in DuckDB's bounded memory.
- Python, used when one attempt is read back (`tbhpc show`, the failure browser): the reference
  messages become tbhpc's OpenAI-style messages, so one renderer serves both.

Reference message types (thinkingbox.common.chat_types): Text (role, content, metadata.tag
think|text|direct, metadata.is_dummy), ToolCall (name, arguments, id, metadata.error),
ParallelToolCall (tool_calls), ToolResponse (name, content, id, metadata.direct_response).
"""
from __future__ import annotations

import json
from typing import Any

FORMAT = "thinkingbox"
_IS_SYSTEM = "json_extract_string(m, 'T') = 'Text' AND json_extract_string(m, 'role') = 'system'"


def _ref(text: str) -> str:
    return f"'tb' || left(sha256({text}), 14)"


def with_parts(lines: str, texts: bool = False) -> str:
    """`lines` (a SELECT with the JSON columns `messages` and `tools`, which it replaces) plus:
    system_ref (content hash of the leading system messages as a JSON list), tools_ref, rest (the
    other messages, JSON) and n_messages; with `texts`, also system_text and tools_text (the blobs)."""
    listed = "CASE WHEN json_type(messages) = 'ARRAY' THEN messages::JSON[] ELSE []::JSON[] END"
    n_system = f"coalesce(list_position(list_transform(ml, lambda m: NOT ({_IS_SYSTEM})), true), len(ml) + 1) - 1"
    system, has_tools = "ml[1:n_system]::JSON::VARCHAR", "json_type(tools) = 'ARRAY' AND json_array_length(tools) > 0"
    blobs = (f"CASE WHEN n_system > 0 THEN {system} END AS system_text, "
             f"CASE WHEN {has_tools} THEN tools::VARCHAR END AS tools_text," if texts else "")
    return f"""
    SELECT * EXCLUDE (ml, n_system, messages, tools), {blobs}
        CASE WHEN n_system > 0 THEN {_ref(system)} END AS system_ref,
        CASE WHEN {has_tools} THEN {_ref('tools::VARCHAR')} END AS tools_ref,
        ml[n_system + 1:]::JSON AS rest, len(ml) AS n_messages
    FROM (SELECT *, {n_system} AS n_system FROM (SELECT *, {listed} AS ml FROM ({lines})))"""


def transcript_column(judge: str) -> str:
    """The transcript document of a line (NULL when it has no messages); `judge` is a JSON
    expression for test_result.metadata.judge_motivation."""
    return (f"CASE WHEN n_messages > 0 THEN json_object('v', 1, 'format', '{FORMAT}', 'system', system_ref, "
            f"'tools', tools_ref, 'messages', rest, 'finish', finish_reason, "
            f"'judge', CASE WHEN json_type({judge}) = 'ARRAY' THEN {judge} ELSE '[]'::JSON END)::VARCHAR END")


def blobs_query(lines: str) -> str:
    """(ref, content) of every distinct system prompt and tool list of `lines`."""
    parts = with_parts(lines, texts=True)
    return f"""
    SELECT ref, any_value(content) FROM (
        SELECT system_ref AS ref, system_text AS content FROM ({parts})
        UNION ALL SELECT tools_ref, tools_text FROM ({parts}))
    WHERE ref IS NOT NULL GROUP BY ref"""


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
