"""`tbhpc import-tb`: load result files of the reference ThinkingBox harness (`tb infer` JSONL, one
DecodeResult per line) into a tbhpc run directory, so every metric works on them too.

Mapping: uid -> task_id; attempt_index = order of the uid's rows across the files; status =
system_error when `is_system_error` or `test_result.is_system_error` is true (or no test result);
passed = `test_result.result`; usage[] summed into agent tokens (input, cached, output,
reasoning); domain = `metadata.scenario`, else the file part of the uid.
"""
from __future__ import annotations

import json
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

from tbhpc.errors import UserError
from tbhpc.store.merge import MergeReport, merge
from tbhpc.store.run_dir import RunDir
from tbhpc.store.schema import ROLES, TOKEN_KINDS
from tbhpc.store.shards import write_shard

ROWS_PER_SHARD = 5000


def domain_of(uid: str, metadata: dict) -> str:
    scenario = (metadata or {}).get("scenario")
    if scenario:
        return str(scenario)
    part = uid.split(":", 1)[0]
    return part[:-3] if part.endswith(".py") else part


def convert(obj: dict, campaign: str, policy_id: str, index: int, where: str) -> dict:
    uid = obj.get("uid")
    if not isinstance(uid, str) or not uid:
        raise UserError(f"{where}: missing string field 'uid'")
    tr = obj.get("test_result") or {}
    if not isinstance(tr, dict):
        raise UserError(f"{where}: field 'test_result' must be an object")
    system_error = bool(obj.get("is_system_error")) or bool(tr.get("is_system_error")) or "result" not in tr
    passed = None if system_error else bool(tr.get("result"))
    reward = None if system_error else float(tr.get("reward", 1.0 if passed else 0.0))
    usage = obj.get("usage") or []
    if isinstance(usage, dict):
        usage = [usage]
    tok = {"in": 0, "cached": 0, "out": 0, "reasoning": 0}
    for u in usage:
        if not isinstance(u, dict):
            raise UserError(f"{where}: field 'usage' must hold objects")
        tok["in"] += int(u.get("input_tokens") or 0)
        tok["cached"] += int((u.get("input_tokens_details") or {}).get("cached_tokens") or 0)
        tok["out"] += int(u.get("output_tokens") or 0)
        tok["reasoning"] += int((u.get("output_tokens_details") or {}).get("reasoning_tokens") or 0)
    meta = obj.get("metadata") or {}
    error = meta.get("error") or tr.get("error") or obj.get("error")
    row = {"campaign": campaign, "task_id": uid, "attempt_index": index, "policy_id": policy_id,
           "domain": domain_of(uid, meta), "reward": reward, "passed": passed,
           "status": "system_error" if system_error else "ok", "finish_reason": obj.get("finish_reason"),
           "error": str(error)[:2000] if error else None, "error_kind": "imported" if system_error else None,
           "finished_at": None, "started_at": None}
    for role in ROLES:
        for kind in TOKEN_KINDS:
            row[f"{role}_{kind}"] = tok[kind] if role == "agent" else 0
    return row


def import_files(files: list[Path], out: Path, campaign: str | None = None, policy_id: str = "thinkingbox") -> tuple[RunDir, MergeReport]:
    run = RunDir(out)
    if run.exists():
        raise UserError(f"{out}: already a run directory; import into a new --out")
    campaign = campaign or Path(files[0]).stem
    seen: Counter[str] = Counter()
    rows = []
    for f in files:  # parse everything first: a bad line stops the import before anything is written
        try:
            lines = Path(f).read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise UserError(f"{f}: cannot read: {exc.strerror}") from None
        for no, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UserError(f"{f}: line {no}: not valid JSON ({exc.msg})") from None
            if not isinstance(obj, dict):
                raise UserError(f"{f}: line {no}: expected a JSON object")
            uid = obj.get("uid")
            rows.append(convert(obj, campaign, policy_id, seen[uid] if isinstance(uid, str) else 0, f"{f}: line {no}"))
            seen[uid] += 1
    if not rows:
        raise UserError(f"{files[0]}: no result rows")
    domains = {r["task_id"]: r["domain"] for r in rows}
    plan = [{"task_id": t, "domain": domains[t], "split": None, "n_golden_calls": None, "tags": [], "template": None,
             "repeats": n} for t, n in sorted(seen.items())]
    meta = {"campaign": campaign, "kind": "eval", "policy_id": policy_id, "config_hash": None, "pack_hash": None,
            "config": {"imported_from": [str(f) for f in files]}, "source": "thinkingbox",
            "created_at": datetime.now(timezone.utc).isoformat(sep=" ")[:26]}
    run.create({"imported_from": [str(f) for f in files]}, "imported", meta, plan)
    for i in range(0, len(rows), ROWS_PER_SHARD):
        write_shard(run.shards, rows[i:i + ROWS_PER_SHARD], name=f"import-{i // ROWS_PER_SHARD:05d}.jsonl")
    return run, merge(run)
