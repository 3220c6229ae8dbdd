"""Weight identity for syncs: digests the publisher writes into a ready marker, compared exactly with
the digests the server computes over what it holds after loading.

Why a second check beside the logprob probe (fingerprint.py): the probe compares what the server
computes with what the trainer computed, within a tolerance that bf16 serving needs (0.1 mean
|Δ logprob|). Two consecutive training steps at lr 1e-6 move the probe by ~0.015, and most bf16
weights not at all, so a server that never reloaded (or reloaded half a model) passes it. The
digest has no tolerance: every tensor the server holds, cast to the dtype it computes in, equals
bit for bit the tensor the trainer published, or the sync is refused naming the first tensor that
differs. The probe stays, for what a digest cannot see: a kernel, dtype or layout that computes
something else from the right weights (docs/guides/serving.md: what each check proves).

Digest definition: `vllm_ext/tbhpc_digest.py` (one implementation, imported by both sides).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TIED_HEAD = "lm_head.weight"


def state_digest(state: dict[str, Any], dtype: str, tied_embeddings: bool = False, threads: int = 1) -> dict:
    """{"dtype", "tensors": {name: hex} in the state dict's order, "total", "digest_s"} of the
    floating-point tensors of a state dict, each cast to `dtype`. With tied embeddings the head is
    listed under its own name too (the server reads it through the head's kernel). `threads`:
    tensors digested concurrently (torch releases the GIL: a publisher's cores all work)."""
    t0 = time.perf_counter()
    return digest_table(digest_each(state, dtype, threads), dtype, tied_embeddings, time.perf_counter() - t0)


def digest_each(state: dict[str, Any], dtype: str, threads: int = 1) -> dict[str, str]:
    """{name: hex digest in `dtype`} of the floating-point tensors, in the state dict's order."""
    from tbhpc.serve.vllm_ext.tbhpc_digest import hexd, tensor_digest   # torch: loaded when used
    names = [n for n, t in state.items() if getattr(t, "is_floating_point", lambda: False)()]
    if threads <= 1 or len(names) < 2:
        return {n: hexd(tensor_digest(state[n], dtype)) for n in names}
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(threads) as pool:
        return dict(zip(names, pool.map(lambda n: hexd(tensor_digest(state[n], dtype)), names)))


def digest_table(tensors: dict[str, str], dtype: str, tied_embeddings: bool = False, seconds: float = 0.0) -> dict:
    """The published digest of a model from its tensors' digests (see state_digest)."""
    from tbhpc.serve.vllm_ext.tbhpc_digest import total_digest
    tensors = dict(tensors)
    if tied_embeddings and TIED_HEAD not in tensors:
        embed = next((n for n in tensors if n.endswith("embed_tokens.weight")), None)
        if embed is not None:
            tensors[TIED_HEAD] = tensors[embed]
    return {"dtype": dtype, "tensors": tensors, "total": total_digest(tensors), "digest_s": round(seconds, 4)}


def model_digests(model: Any, dtypes: list[str], state_dict: dict | None = None) -> dict[str, dict]:
    """{dtype: state_digest} of what a checkpoint of `model` holds (`state_dict` when the caller
    gathered it, e.g. from sharded parameters)."""
    state = state_dict if state_dict is not None else model.state_dict()
    tied = bool(getattr(getattr(model, "config", None), "tie_word_embeddings", False))
    return {dt: state_digest(state, dt, tied) for dt in dtypes}


def served_dtypes(run_dir: Path | str | None, model_dtype: str) -> list[str]:
    """The dtypes a publisher digests for: the one the run's server announced in endpoint.json,
    else the checkpoint's own dtype and bfloat16 (vLLM's usual serving dtype)."""
    if run_dir is not None:
        try:
            announced = json.loads((Path(run_dir) / "endpoint.json").read_text()).get("dtype")
            if announced:
                return [announced]
        except (OSError, ValueError):
            pass
    own = str(model_dtype).removeprefix("torch.")
    return list(dict.fromkeys([own if own in ("float32", "bfloat16", "float16") else "float32", "bfloat16"]))


@dataclass
class DigestCheck:
    dtype: str
    tensors: int = 0              # checkpoint tensors compared
    kernel_copies: int = 0        # of which read back from packed kernel copies too
    mismatch: str = ""            # the first difference, '' when none
    not_served: int = 0           # published tensors the server holds under no name (e.g. a tied head on F.linear)
    seconds: float = 0.0          # the server's time to digest what it holds
    total: str = ""
    unsupported: str = ""         # the server could not digest (no worker extension, a worker silent): a failure
    replicas: int = 1             # data-parallel replicas checked, each against the whole digest
    workers: int = 1              # vLLM workers whose partial digests were added up

    @property
    def equal(self) -> bool:
        return not self.unsupported and not self.mismatch and self.tensors > 0

    def summary(self) -> str:
        if self.unsupported:
            return f"digest: NOT CHECKED ({self.unsupported})"
        if self.mismatch:
            return f"digest: DIFFERS ({self.dtype}): {self.mismatch}"
        where = f", on {self.replicas} replicas x {self.workers // self.replicas} workers" if self.workers > 1 else ""
        return (f"digest: identical ({self.dtype}, {self.tensors} tensors, {self.kernel_copies} read back from packed "
                f"kernels{where}, total {self.total}); {self.seconds * 1000:.0f} ms on the server")

    def to_json(self) -> dict:
        out = {"digest_equal": self.equal, "digest_dtype": self.dtype,
               "digest_tensors": self.tensors, "digest_kernel_copies": self.kernel_copies,
               "digest_s": round(self.seconds, 4), "digest_total": self.total,
               "digest_replicas": self.replicas, "digest_workers": self.workers}
        if self.mismatch:
            out["digest_mismatch"] = self.mismatch
        if self.unsupported:
            out["digest_unsupported"] = self.unsupported
        return out


def merge_served(results: list) -> list[dict] | dict:
    """Per-worker digest reports -> one report per data-parallel replica, its tensor-parallel (and
    pipeline) workers' partial sums added (mod 2^64) into whole-tensor digests; or {"unsupported":
    why} when a worker's report is missing: every replica, every shard, or the check fails."""
    from tbhpc.serve.vllm_ext.tbhpc_digest import MASK64, hexd
    failed = [r for r in results if isinstance(r, dict) and r.get("error")]
    if failed:
        r = failed[0]
        return {"unsupported": f"worker dp{r.get('dp_rank', 0)}-tp{r.get('tp_rank', 0)} could not digest: {r['error']}"}
    reports = [r for r in results if isinstance(r, dict) and "tensors" in r]
    if not reports:
        return {"unsupported": "no digest from the server (no tbhpc worker extension?)"}
    first = reports[0]
    dp = max([int(first.get("dp", 1))] + [int(r.get("dp_rank", 0)) + 1 for r in reports])
    shards = int(first.get("tp", 1)) * int(first.get("pp", 1))
    if "tp_rank" not in first and len(reports) > 1:
        return {"unsupported": f"{len(reports)} workers reported without their place (an older worker extension)"}
    by_replica: dict[int, dict[tuple[int, int], dict]] = {}
    for r in reports:
        by_replica.setdefault(int(r.get("dp_rank", 0)), {})[(int(r.get("pp_rank", 0)), int(r.get("tp_rank", 0)))] = r
    missing = [f"replica {d}" + (f" ({shards - len(by_replica.get(d, {}))} of {shards} workers)" if d in by_replica else "")
               for d in range(dp) if len(by_replica.get(d, {})) != shards]
    if missing:
        return {"unsupported": f"no digest from {', '.join(missing)} of {dp} x {shards} workers"}
    out = []
    for d in range(dp):
        tensors: dict[str, dict] = {}
        workers = by_replica[d].values()
        for r in workers:
            for name, entry in r["tensors"].items():
                acc = tensors.setdefault(name, {"shape": entry.get("shape")})
                for kind in ("param", "kernel"):
                    if kind in entry:
                        acc[kind] = (acc.get(kind, 0) + int(entry[kind], 16)) & MASK64
        out.append({"dtype": first.get("dtype"), "replica": d, "workers": len(workers),
                    "digest_s": max(float(r.get("digest_s", 0.0)) for r in workers),
                    "tensors": {n: {k: (hexd(v) if k != "shape" else v) for k, v in e.items()} for n, e in tensors.items()}})
    return out


def compare_replicas(published: dict, served: list[dict] | dict) -> DigestCheck:
    """`compare` on every data-parallel replica: the first that differs is the verdict, named."""
    if isinstance(served, dict):
        return compare(published, served)
    check = None
    for replica in served:
        check = compare(published, replica)
        check.replicas, check.workers = len(served), sum(int(r.get("workers", 1)) for r in served)
        if check.mismatch and len(served) > 1:
            check.mismatch = f"replica {replica['replica']} of {len(served)}: {check.mismatch}"
        if not check.equal:
            return check
    return check


def compare(published: dict, served: dict) -> DigestCheck:
    """Exact comparison, in the published (model) order: every tensor the server holds, through
    every copy it holds (parameter, packed kernel), must equal the published digest."""
    dtype = published.get("dtype", "")
    if served.get("unsupported"):
        return DigestCheck(dtype, unsupported=served["unsupported"])
    check = DigestCheck(dtype, seconds=float(served.get("digest_s", 0.0)))
    if served.get("dtype") != dtype:
        check.mismatch = f"the server computes in {served.get('dtype')}, the digest is of {dtype}"
        return check
    want, held = published.get("tensors") or {}, served.get("tensors") or {}
    for name, digest in want.items():
        copies = held.get(name)
        if copies is None:
            check.not_served += 1
            continue
        check.tensors += 1
        check.kernel_copies += "kernel" in copies
        for kind in ("param", "kernel"):
            if kind in copies and copies[kind] != digest and not check.mismatch:
                check.mismatch = (f"{name} ({'packed kernel copy' if kind == 'kernel' else 'parameter'}, shape "
                                  f"{copies.get('shape')}): served {copies[kind]}, published {digest}")
    unknown = [n for n in held if n not in want]
    if unknown and not check.mismatch:
        check.mismatch = f"the server holds {len(unknown)} tensor(s) the checkpoint has no digest for ({unknown[0]}, ...)"
    if not check.mismatch:
        check.total = published.get("total", "")
        if check.tensors == 0:
            check.mismatch = "no tensor in common between the server and the published digest"
    return check
