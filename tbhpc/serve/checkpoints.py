"""Weight sync over the shared filesystem: the trainer publishes, the server picks up.

Protocol (both sides import only this module):
1. the trainer writes an HF checkpoint (safetensors + config + tokenizer) to
   `RUN/checkpoints/.tmp-step-NNNNNN/` and renames it to `step-NNNNNN/` (a directory is whole or absent);
2. it then writes the marker `step-NNNNNN.ready` (JSON: step, path, published_at);
3. the server's supervisor sees the newest marker, loads those weights, and reports version
   `step-NNNNNN` (endpoint.json, `/v1/models`, and on every generated token span).
Each sync is timed and appended to `RUN/logs/weight_sync.jsonl`.
Why files and not NCCL: it works across jobs, partitions and restarts, survives either side
being requeued, and is what the published stack does; an NCCL broadcast can replace step 1-2
later behind the same `publish_checkpoint` call.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CKPT_DIR = "checkpoints"


def version_name(step: int) -> str:
    return f"step-{step:06d}"


@dataclass(frozen=True)
class Published:
    step: int
    path: Path
    published_at: float

    @property
    def version(self) -> str:
        return version_name(self.step)


def publish_checkpoint(run_dir: Path | str, step: int, model: Any, tokenizer: Any = None) -> Published:
    """Save `model` (and tokenizer) with save_pretrained as safetensors, then mark it ready."""
    root = Path(run_dir) / CKPT_DIR
    root.mkdir(parents=True, exist_ok=True)
    final = root / version_name(step)
    tmp = root / f".tmp-{final.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    return mark_ready(run_dir, step, final)


def mark_ready(run_dir: Path | str, step: int, path: Path | str) -> Published:
    """Step 2 alone, for a checkpoint directory written by other code (e.g. DeepSpeed's consolidation)."""
    root = Path(run_dir) / CKPT_DIR
    root.mkdir(parents=True, exist_ok=True)
    pub = Published(step, Path(path).resolve(), time.time())
    marker = root / f"{version_name(step)}.ready"
    tmp = marker.with_name(f".tmp-{marker.name}")
    tmp.write_text(json.dumps({"step": step, "path": str(pub.path), "published_at": pub.published_at}) + "\n")
    os.replace(tmp, marker)
    return pub


def latest_ready(run_dir: Path | str) -> Published | None:
    """The newest published checkpoint (highest step with a marker), or None."""
    root = Path(run_dir) / CKPT_DIR
    best: Published | None = None
    for marker in root.glob("step-*.ready"):
        try:
            d = json.loads(marker.read_text())
            pub = Published(int(d["step"]), Path(d["path"]), float(d["published_at"]))
        except (ValueError, KeyError, OSError):
            continue   # half-visible marker on a slow shared FS: picked up next poll
        if best is None or pub.step > best.step:
            best = pub
    return best


def record_sync(run_dir: Path | str, entry: dict) -> None:
    log = Path(run_dir) / "logs" / "weight_sync.jsonl"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a", encoding="utf-8") as f:
        f.write(json.dumps(entry) + "\n")


def read_syncs(run_dir: Path | str) -> list[dict]:
    log = Path(run_dir) / "logs" / "weight_sync.jsonl"
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
