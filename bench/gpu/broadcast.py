"""Part `nccl`, 4: tbhpc's weight broadcast from this process to a second one (spawned from this file,
not from a script on stdin, which `spawn` cannot re-import). NCCL refuses two ranks on one GPU, so
with one GPU the part says which backend it could use: NCCL, else gloo with the tensors via the host."""
import multiprocessing as mp
import time

import torch
from common import DEVICE, REHEARSAL, first_line, scale

from tbhpc.serve.vllm_ext import tbhpc_wire as wire

TOKEN = "t" * 43


def receive(port: int, device: str, meta: list, q) -> None:
    group, why_not = wire.join("127.0.0.1", port, 1, 2, device, 120, TOKEN)
    if group is None:
        q.put(why_not)
        return
    q.put(wire.take(group, meta, wire.DEFAULT_BUCKET_BYTES, lambda stream: {"n": sum(1 for _ in stream)}))


def run(device: str) -> tuple[int, float]:
    n = scale(64 << 20, 1 << 16)
    state = {f"w{i}": torch.randn(n, device=DEVICE, dtype=torch.bfloat16) for i in range(16)}    # 2.1 GB on a GPU
    meta = [wire.meta_of(k, t) for k, t in state.items()]
    group = wire.listen("127.0.0.1", 2, device, 120, TOKEN)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    proc = ctx.Process(target=receive, args=(group.port, device, meta, q))
    proc.start()
    try:
        if not group.wait_joined(60):
            raise RuntimeError("the receiver did not join within 60 s")
        t0 = time.perf_counter()
        sent = wire.send(group, meta, state.values())         # returns once every byte has landed
        seconds = time.perf_counter() - t0
        report = q.get(timeout=120)
        if report.get("bytes") != sent or report.get("failed"):
            raise RuntimeError(f"the receiver reported {report}")
        return sent, seconds
    finally:
        proc.join(30)
        if proc.is_alive():
            proc.kill()


if __name__ == "__main__":
    for device in (("cpu",) if REHEARSAL else ("cuda", "cpu")):
        try:
            sent, s = run(device)
            print(f"weight broadcast to a second process over {'NCCL' if device == 'cuda' else 'gloo'}"
                  f"{' (rehearsal)' if REHEARSAL else ''}: {sent / 1e9:.3f} GB in {s:.2f} s = {sent / s / 1e9:.2f} GB/s",
                  flush=True)
            break
        except Exception as exc:
            print(f"over {'NCCL' if device == 'cuda' else 'gloo'}: {first_line(exc)}", flush=True)
    else:
        raise SystemExit("the broadcast reached no second process")
