"""Weight sync over the shared filesystem: the trainer publishes, the server picks up.

Protocol (both sides import only this module):
1. the trainer writes an HF checkpoint (safetensors + config + tokenizer) to
   `RUN/checkpoints/.tmp-step-NNNNNN/` and renames it to `step-NNNNNN/` (a directory is whole or absent);
2. it then writes the marker `step-NNNNNN.ready` (JSON: step, path, published_at, the exact
   digests of the weights it wrote, cast to the dtype the server computes in (`digest.py`), and
   the checkpoint's fingerprint: a fixed probe and its own logprobs on it, `fingerprint.py`);
3. the server's supervisor sees the newest marker, loads those weights under the provisional
   version `unverified:step-NNNNNN`, digests what the server now holds and scores the probe
   through it, and only when the digests are identical and the probe matches announces
   `step-NNNNNN` (endpoint.json, `/v1/models`, every generated token span); a mismatch leaves
   `rejected:step-NNNNNN` there instead.
Each sync is timed and appended to `RUN/logs/weight_sync.jsonl` with the check's figures.
Samples tagged with anything but `base` or `step-N` are never trained on (`trusted_version`).
A LoRA run publishes its adapter alone (`weights: adapter`, serve/adapter.py), which a LoRA server loads
in place over its base. Files work across jobs, partitions and restarts and survive either side being requeued; a
broadcast (broadcast.py) moves the weights in seconds instead of minutes and ends in the same
ready marker (no path), checked the same way. Files stay the fallback and what a server starts from.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tbhpc.serve.digest import model_digests, served_dtypes
from tbhpc.serve.fingerprint import Fingerprint, compute_fingerprint, load_checkpoint
# the version names, also here: a reader of checkpoints needs them with what they name
from tbhpc.serve.versions import (BASE_VERSION, REJECTED, UNVERIFIED, trusted_version,  # noqa: F401
                                  version_name, version_step)

CKPT_DIR = "checkpoints"


@dataclass(frozen=True)
class Published:
    step: int
    path: Path | None                   # None: broadcast into the server (broadcast.py), no files
    published_at: float
    fingerprint: dict | None = None     # Fingerprint.to_json(), None when the publisher stored none
    digests: dict | None = None         # {dtype: digest.state_digest(...)}, None when the publisher stored none
    transport: str = "files"            # files | broadcast
    weights: str = "full"               # full (an HF checkpoint) | adapter (a LoRA adapter for the served base)

    @property
    def version(self) -> str:
        return version_name(self.step)


def publish_checkpoint(run_dir: Path | str, step: int, model: Any, tokenizer: Any = None,
                       fingerprint: Fingerprint | None = None, state_dict: dict | None = None) -> Published:
    """Save `model` (and tokenizer) with save_pretrained as safetensors, digest what was written
    (in the dtype the run's server computes in), fingerprint it (one forward pass on the probe,
    unless the caller computed `fingerprint` itself), then mark it ready. `state_dict`: the
    gathered tensors of a trainer whose parameters are sharded (they are what gets written)."""
    fp = fingerprint or compute_fingerprint(model, tokenizer)
    digests = model_digests(model, served_dtypes(run_dir, _dtype_name(model, state_dict)), state_dict)
    return mark_ready(run_dir, step, write_checkpoint(run_dir, step, model, tokenizer, state_dict), fp, digests)


def _dtype_name(model: Any, state_dict: dict | None) -> str:
    first = next(iter(state_dict.values()), None) if state_dict else None
    return str(getattr(first, "dtype", None) or getattr(model, "dtype", "float32")).removeprefix("torch.")


@contextmanager
def whole_dir(dest: Path):
    """Write a directory whole or not at all: the body fills the yielded temporary directory beside
    `dest`, which then replaces `dest` (a reader sees the old one, the new one, or none)."""
    tmp = dest.with_name(f".tmp-{dest.name}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    yield tmp
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(tmp, dest)


def write_checkpoint(run_dir: Path | str, step: int, model: Any, tokenizer: Any = None,
                     state_dict: dict | None = None) -> Path:
    """Step 1 alone: `RUN/checkpoints/step-N/` written whole or not at all. `state_dict` replaces
    the model's own tensors (a trainer whose parameters are sharded passes the gathered ones)."""
    final = Path(run_dir) / CKPT_DIR / version_name(step)
    with whole_dir(final) as tmp:
        model.save_pretrained(tmp, safe_serialization=True, **({"state_dict": state_dict} if state_dict is not None else {}))
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
    return final


def mark_ready(run_dir: Path | str, step: int, path: Path | str | None, fingerprint: Fingerprint | None = None,
               digests: dict | None = None, transport: str = "files", weights: str = "full") -> Published:
    """Step 2 alone, for a checkpoint directory written by other code (e.g. DeepSpeed's
    consolidation). What the caller does not pass (fingerprint, digests) is computed from the
    directory, loaded once on the CPU. `path` None: weights broadcast into the server (both given).
    `weights`: adapter for a LoRA adapter directory (serve/adapter.py; both given)."""
    if fingerprint is None or digests is None:
        model, tok = load_checkpoint(str(path))
        fingerprint = fingerprint or compute_fingerprint(model, tok)
        digests = digests or model_digests(model, served_dtypes(run_dir, _dtype_name(model, None)))
    root = Path(run_dir) / CKPT_DIR
    root.mkdir(parents=True, exist_ok=True)
    pub = Published(step, Path(path).resolve() if path is not None else None, time.time(), fingerprint.to_json(),
                    digests, transport, weights)
    marker = root / f"{version_name(step)}.ready"
    tmp = marker.with_name(f".tmp-{marker.name}")
    tmp.write_text(json.dumps({"step": step, "path": str(pub.path) if pub.path else None, "published_at": pub.published_at,
                               "digests": pub.digests, "fingerprint": pub.fingerprint, "transport": transport,
                               "weights": weights}) + "\n")
    os.replace(tmp, marker)
    return pub


def latest_ready(run_dir: Path | str, loadable: bool = False) -> Published | None:
    """The newest published checkpoint (highest step with a marker), or None; `loadable`: the newest
    with files a server can start from (broadcast syncs leave none)."""
    best: Published | None = None
    for marker in (Path(run_dir) / CKPT_DIR).glob("step-*.ready"):
        pub = _read_marker(marker)
        if pub is not None and not (loadable and pub.path is None) and (best is None or pub.step > best.step):
            best = pub
    return best


def published(run_dir: Path | str, step: int) -> Published | None:
    """The marker of one step, or None."""
    return _read_marker(Path(run_dir) / CKPT_DIR / f"{version_name(step)}.ready")


def _read_marker(marker: Path) -> Published | None:
    try:
        d = json.loads(marker.read_text())
        return Published(int(d["step"]), Path(d["path"]) if d.get("path") else None, float(d["published_at"]),
                         d.get("fingerprint"), d.get("digests"), d.get("transport", "files"), d.get("weights", "full"))
    except (ValueError, KeyError, OSError):
        return None   # absent, or half-visible on a slow shared FS: picked up next poll


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
