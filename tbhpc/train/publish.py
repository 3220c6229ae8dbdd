"""Publishing a step's weights for the server: a broadcast into it, or files written by every rank.

Why two transports behind one call (`publish`, which also exports when one is due and keeps the
newest `keep_published` publications): a broadcast (serve/broadcast.py) moves the weights
in seconds but needs the server up and waiting; files work whatever state the server is in and are
what a (re)started server and an export load. So a run configured for `sync_transport: broadcast`
offers a broadcast and falls back to files when nobody joins in time.

Why every rank writes: gathering a 27B model to rank 0 and writing it from one process (one
digest thread, one stream to the file system) takes minutes. Here parameters are gathered a module
at a time, each rank keeps every world-th tensor, digests its share on all its threads, writes it
as its own safetensors shard, and rank 0 writes the index, config and tokenizer. Both transports end
in the same ready marker (serve/checkpoints.py), carrying digests of exactly what was sent or written.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from tbhpc.serve.broadcast import OFFER, Sender, digesting, sender_device
from tbhpc.serve.checkpoints import CKPT_DIR, mark_ready, version_name
from tbhpc.serve.digest import digest_each, digest_table, served_dtypes
from tbhpc.serve.fingerprint import Fingerprint, compute_fingerprint
from tbhpc.train.jobs import start_export_eval


def digest_threads() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


def write_shards(eng, dest: Path, dtypes: list[str], tied: bool) -> tuple[dict[str, dict], dict]:
    """Every rank writes its share of the weights under `dest` (a directory on the shared file system,
    written whole or not at all); returns (rank 0: {dtype: digest}, timings). Collective."""
    import torch.distributed as dist
    from safetensors.torch import save_file
    rank, world = eng.env.rank, eng.env.world
    tmp = dest.with_name(f".tmp-{dest.name}")
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    eng.barrier()
    t0 = time.monotonic()
    mine = {name: t.cpu() for i, name, t in eng.full_params(keep=lambda i: i % world == rank) if t is not None}
    t1 = time.monotonic()
    digests = {dt: digest_each(mine, dt, digest_threads()) for dt in dtypes}
    t2 = time.monotonic()
    shard = "model.safetensors" if world == 1 else f"model-{rank + 1:05d}-of-{world:05d}.safetensors"
    if mine:
        save_file({n: t.contiguous() for n, t in mine.items()}, str(tmp / shard), metadata={"format": "pt"})
    t3 = time.monotonic()
    local = {"shard": shard, "names": list(mine), "bytes": sum(t.numel() * t.element_size() for t in mine.values()),
             "digests": digests}
    parts = [local]
    if world > 1:
        parts = [None] * world
        dist.all_gather_object(parts, local)
    out: dict[str, dict] = {}
    if rank == 0:
        order = [m["name"] for m in eng.param_meta()]
        weight_map = {n: p["shard"] for p in parts for n in p["names"]}
        if world > 1:                     # one rank: HF's single-file layout, no index
            (tmp / "model.safetensors.index.json").write_text(json.dumps(
                {"metadata": {"total_size": sum(p["bytes"] for p in parts)},
                 "weight_map": {n: weight_map[n] for n in order if n in weight_map}}, indent=1))
        eng.module.config.save_pretrained(tmp)
        if getattr(eng.module, "generation_config", None) is not None:
            eng.module.generation_config.save_pretrained(tmp)
        if eng.tokenizer is not None:
            eng.tokenizer.save_pretrained(tmp)
        for dt in dtypes:
            every = {n: h for p in parts for n, h in p["digests"][dt].items()}
            out[dt] = digest_table({n: every[n] for n in order if n in every}, dt, tied, t2 - t1)
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    eng.barrier()
    return out, {"gather_s": round(t1 - t0, 4), "digest_s": round(t2 - t1, 4), "write_s": round(t3 - t2, 4),
                 "bytes": sum(p["bytes"] for p in parts), "ranks": world}


def publish_files(eng, run_path: Path, step: int, fp: Fingerprint) -> dict:
    """checkpoints/step-N written by every rank, then its ready marker (rank 0). Collective."""
    dest = run_path / CKPT_DIR / version_name(step)
    tied = bool(getattr(eng.module.config, "tie_word_embeddings", False))
    digests, timings = write_shards(eng, dest, served_dtypes(run_path, fp.dtype), tied)
    if eng.env.rank == 0:
        mark_ready(run_path, step, dest, fp, digests)
    return {"transport": "files", **timings}


def publish_broadcast(eng, run_path: Path, step: int, fp: Fingerprint, join_timeout_s: float, bucket_bytes: int,
                      gpu: bool, log=print) -> dict | None:
    """Offer the weights to the run's server and stream them in (None on every rank when nobody
    joined in time, or a member of the group could not prove the run's token: the caller publishes
    files). Collective."""
    from tbhpc.serve.endpoint import endpoint_path, read_endpoint
    sender, t0 = None, time.monotonic()
    if eng.env.rank == 0 and endpoint_path(run_path).exists():
        ep = read_endpoint(run_path)
        dtype = ep.dtype or served_dtypes(None, fp.dtype)[0]
        device = sender_device(gpu)
        if (ep.device or "cpu") == ("cuda" if gpu else "cpu"):      # NCCL needs GPUs on both sides, gloo CPUs
            sender = Sender(run_path, step, eng.param_meta(), max(1, ep.workers), device, join_timeout_s + 600,
                            bucket_bytes)
            if not sender.wait_joined(join_timeout_s):
                if sender.refused:
                    log(f"train: step {step}: {sender.refused}")
                sender = None
    joined = eng.all_reduce([1.0 if sender is not None else 0.0], "max")[0] > 0
    if not joined:
        return None
    t1 = time.monotonic()
    stream = eng.full_params()
    if sender is None:
        for _ in stream:                  # the other ranks' share of each gather
            pass
        return {"transport": "broadcast"}
    tensors: dict[str, str] = {}
    sent = sender.send(digesting(((n, t) for _, n, t in stream), dtype, tensors))
    t2 = time.monotonic()
    tied = bool(getattr(eng.module.config, "tie_word_embeddings", False))
    mark_ready(run_path, step, None, fp, {dtype: digest_table(tensors, dtype, tied)}, transport="broadcast")
    return {"transport": "broadcast", "join_s": round(sender.join_s, 4), "stream_s": round(t2 - t1, 4),
            "bytes": sent, "offer_s": round(t1 - t0, 4), "gb_per_s": round(sent / max(t2 - t1, 1e-9) / 1e9, 3)}


def publish_adapter(eng, run_path: Path, step: int, fp: Fingerprint, dest: Path | None = None) -> dict:
    """A LoRA run's step: its adapter alone (serve/adapter.py: PEFT's format, the scale folded into B),
    digested in the served dtype and written by rank 0 to checkpoints/step-N, then its ready marker
    (`weights: adapter`). Megabytes where a full publication moves the model. `dest`: write there
    instead, with no marker (an export). Collective under ZeRO-3 (the adapters are gathered)."""
    from tbhpc.serve.adapter import adapter_digests, write_adapter
    from tbhpc.train.lora import adapter_tensors
    rank0 = eng.env.rank == 0
    t0 = time.monotonic()
    tensors = adapter_tensors(eng.module, eng.cfg.zero_stage == 3, rank0)
    t1 = t2 = t3 = time.monotonic()
    if rank0:
        digests = adapter_digests(tensors, served_dtypes(run_path, fp.dtype)) if dest is None else {}
        t2 = time.monotonic()
        where = write_adapter(dest or run_path / CKPT_DIR / version_name(step), tensors, eng.cfg.lora_rank,
                              eng.cfg.lora_targets, str(eng.cfg.model))
        t3 = time.monotonic()
        if dest is None:
            mark_ready(run_path, step, where, fp, digests, weights="adapter")
    eng.barrier()
    return {"transport": "files", "weights": "adapter", "gather_s": round(t1 - t0, 4), "digest_s": round(t2 - t1, 4),
            "write_s": round(t3 - t2, 4), "bytes": sum(t.numel() * t.element_size() for t in tensors.values()),
            "tensors": len(tensors), "ranks": eng.env.world}


def export_step(eng, run_path: Path, step: int, how: dict) -> Path:
    """RUN/exports/step-N: what was published as files, copied, else written again (a broadcast).
    A LoRA run's is its adapter (PEFT's format), and with export_merged (or an export eval to run)
    RUN/exports/step-N-merged is the HF checkpoint too. Returns the directory an export eval loads
    (the HF checkpoint). Collective."""
    from tbhpc.serve.checkpoints import published
    cfg, rank0 = eng.cfg, eng.env.rank == 0
    dest = run_path / "exports" / version_name(step)
    as_files = how["transport"] == "files"
    weights = how.get("weights", "full")

    def copy(to: Path) -> None:
        if rank0:
            shutil.rmtree(to, ignore_errors=True)
            shutil.copytree(published(run_path, step).path, to)
        eng.barrier()

    if cfg.lora_rank:
        if as_files and weights == "adapter":
            copy(dest)
        else:
            publish_adapter(eng, run_path, step, None, dest)
        if not (cfg.export_merged or cfg.export_eval):
            return dest
        dest = dest.with_name(dest.name + "-merged")
    if as_files and weights == "full":
        copy(dest)
    else:
        write_shards(eng, dest, [], False)
    return dest


def publish(eng, run_path: Path, step: int, final: bool, log=print) -> None:
    """This step's weights to the server (a broadcast, else files every rank writes), with digests
    of exactly what was sent or written and the fingerprint; an export when one is due (`final`:
    the run ends after this step). Collective: every rank calls it."""
    cfg, rank0 = eng.cfg, eng.env.rank == 0
    fp = compute_fingerprint(eng.module, eng.tokenizer)
    how = publish_adapter(eng, run_path, step, fp) if cfg.adapter_sync else None
    if how is None and cfg.sync_transport == "broadcast":
        how = publish_broadcast(eng, run_path, step, fp, cfg.sync_join_timeout_s, cfg.sync_bucket_mb << 20, eng.gpu, log)
    if how is None:
        if cfg.sync_transport == "broadcast" and rank0:
            log(f"train: step {step}: no server took the broadcast within {cfg.sync_join_timeout_s:g} s "
                "(none running, restarting, on another device, or not every member proved the run's token); "
                "publishing files instead")
        how = publish_files(eng, run_path, step, fp)
    if rank0:                        # what each publication cost, phase by phase (docs/weight-sync.md)
        (run_path / "logs").mkdir(exist_ok=True)
        with open(run_path / "logs" / "publish.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps({"step": step, "at": time.time(), **how}) + "\n")
    if (cfg.export_every and step % cfg.export_every == 0) or step == cfg.steps or final:
        dest = export_step(eng, run_path, step, how)
        if rank0 and cfg.export_eval:
            log(start_export_eval(cfg, run_path, step, dest))
    if rank0:
        prune_published(run_path, step, cfg.keep_published)
    eng.barrier()


def rewind_publications(run_path: Path, resumed: int) -> bool:
    """A run resumed from the DeepSpeed checkpoint of step `resumed` discards what it published
    after it (the server may serve one of those: its next sync goes back to `resumed`, by time of
    publication). True when there was anything to discard. Rank 0 only."""
    ckpts, found = run_path / CKPT_DIR, False
    for marker in sorted(ckpts.glob("step-*.ready")) + sorted(ckpts.glob(f"step-*{OFFER}")):
        step = int(marker.name[5:11])
        if step > resumed:
            marker.unlink(missing_ok=True)
            shutil.rmtree(ckpts / version_name(step), ignore_errors=True)
            found = True
    return found


def prune_published(run_path: Path, step: int, keep: int) -> None:
    """Published weights older than the newest `keep` go (marker first, so nobody picks up a
    directory that is being removed); exports/ keeps its own copies."""
    for old in range(1, step - keep + 1):
        marker = run_path / CKPT_DIR / f"{version_name(old)}.ready"
        if marker.exists():
            marker.unlink()
            shutil.rmtree(run_path / CKPT_DIR / version_name(old), ignore_errors=True)
