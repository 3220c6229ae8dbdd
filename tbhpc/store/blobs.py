"""Content-addressed blobs: a JSON value written once under the hash of its text.

Why its own module: transcripts (written by campaigns) and ThinkingBox transcripts (written by
`import-tb`) both store the bulky shared parts of a conversation (system prompt, tool schemas)
as `blobs/<sha256[:16]>.json`, and the merge loads them into the `blobs` table; the naming rule
must be one function so the same value always lands under the same reference.
"""
from __future__ import annotations

import hashlib
import json
import os
import uuid
from pathlib import Path
from typing import Any


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
