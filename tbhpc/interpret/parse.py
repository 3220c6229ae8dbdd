"""Split raw model text into reasoning, visible text and tool calls.

Formats understood, in the order a Qwen3-style server would apply them:
1. reasoning: `<think>...</think>`; a `</think>` without an opening tag (the template opened it)
   makes everything before it reasoning; an unclosed `<think>` makes the rest reasoning.
2. tool calls inside `<tool_call>...</tool_call>` (an unclosed last block is still read):
   - Qwen3 XML: `<function=NAME><parameter=P>value</parameter>...</function>`
   - Hermes JSON: `{"name": NAME, "arguments": {...} or "<json string>"}`
3. argument values coerced to the tool's schema types (see `coerce`).
A call that cannot be parsed becomes a `ToolCall` with `error` set; the episode shows that
error to the model as the tool's output.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from tbhpc.interpret.coerce import coerce_arguments

_END_MARKERS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "</s>")
_CALL_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.S)
_FUNCTION = re.compile(r"<function=([^>\n]+)>(.*?)(?:</function>|\Z)", re.S)
_PARAM = re.compile(r"<parameter=([^>\n]+)>(.*?)(?:</parameter>|(?=<parameter=)|(?=</function>)|\Z)", re.S)


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    raw: str = ""


@dataclass
class Interpretation:
    reasoning: str
    text: str
    tool_calls: list[ToolCall]


def interpret(raw: str, tool_schemas: dict[str, dict] | None = None) -> Interpretation:
    """`tool_schemas` maps tool name -> parameters schema (for coercion); may be empty."""
    text = raw or ""
    for marker in _END_MARKERS:
        text = text.replace(marker, "")
    reasoning, text = _split_reasoning(text)
    calls = [_parse_block(b.group(1), tool_schemas or {}) for b in _CALL_BLOCK.finditer(text)]
    visible = _CALL_BLOCK.sub("", text).strip()
    return Interpretation(reasoning.strip(), visible, calls)


def _split_reasoning(text: str) -> tuple[str, str]:
    if "</think>" in text:
        head, _, tail = text.partition("</think>")
        head = head.split("<think>", 1)[1] if "<think>" in head else head
        return head, tail
    if "<think>" in text:
        before, _, after = text.partition("<think>")
        return after, before
    return "", text


def _parse_block(body: str, schemas: dict[str, dict]) -> ToolCall:
    raw = body
    body = body.strip()
    if body.startswith("<function="):
        call = _parse_xml(body, schemas)
    elif body.startswith("{"):
        call = _parse_json(body, schemas)
    else:
        call = ToolCall("", error="could not parse tool call: expected <function=NAME> or a JSON object")
    call.raw = raw
    return call


def _parse_xml(body: str, schemas: dict[str, dict]) -> ToolCall:
    m = _FUNCTION.match(body)
    if not m:
        return ToolCall("", error="could not parse tool call: malformed <function=...> block")
    name = m.group(1).strip()
    args: dict[str, Any] = {}
    for p in _PARAM.finditer(m.group(2)):
        value = p.group(2)
        if value.startswith("\n"):
            value = value[1:]
        if value.endswith("\n"):
            value = value[:-1]
        args[p.group(1).strip()] = value
    leftover = _PARAM.sub("", m.group(2)).strip()
    if leftover:
        return ToolCall(name, args, error=f"could not parse tool call: unexpected text in <function={name}>")
    return ToolCall(name, coerce_arguments(args, schemas.get(name)))


def _parse_json(body: str, schemas: dict[str, dict]) -> ToolCall:
    try:
        obj, end = json.JSONDecoder().raw_decode(body)
    except json.JSONDecodeError as exc:
        return ToolCall("", error=f"could not parse tool call: invalid JSON ({exc.msg} at char {exc.pos})")
    if body[end:].strip():
        return ToolCall("", error="could not parse tool call: text after the JSON object")
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return ToolCall("", error='could not parse tool call: expected {"name": ..., "arguments": {...}}')
    name = obj["name"]
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as exc:
            return ToolCall(name, error=f"could not parse arguments of {name}: invalid JSON ({exc.msg})")
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return ToolCall(name, error=f"could not parse arguments of {name}: expected a JSON object")
    return ToolCall(name, coerce_arguments(args, schemas.get(name)))


def render_tool_call(name: str, arguments: dict[str, Any], fmt: str = "hermes") -> str:
    """The text a model emits for one call, in either format (used by scripted policies and
    to turn server-parsed calls back into text, so that this module stays the only parser)."""
    if fmt == "hermes":
        return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + "\n</tool_call>"
    if fmt == "qwen3_xml":
        parts = [f"<tool_call>\n<function={name}>"]
        for k, v in arguments.items():
            text = v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)
            parts.append(f"<parameter={k}>\n{text}\n</parameter>")
        parts.append("</function>\n</tool_call>")
        return "\n".join(parts)
    raise ValueError(f"unknown tool-call format {fmt!r}")
