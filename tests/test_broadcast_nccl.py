"""The weight broadcast under NCCL's rules, on CPUs: every group here is formed with the stand-in of
tests/nccl_standin.py (asynchronous completion, no size check, abort when dropped, refusal as
DistBackendError), a stand-in because NCCL needs GPUs; the bytes move over real gloo between real
processes. What each test holds is what a GPU run needs of tbhpc_wire:
- the group is not dropped, nor the transfer called done, before the last bucket has landed;
- a receiver whose loader fails, and a sender whose stream fails, still run every collective (no
  member is left in a collective of another size) and the failure is reported, not hidden;
- a group NCCL refuses to form sends both sides to files, and raises nowhere."""
import multiprocessing as mp
import time

import pytest
import torch

import nccl_standin
from tbhpc.serve.auth import ensure_token
from tbhpc.serve.broadcast import Sender, latest_offer, offer_path
from tbhpc.serve.vllm_ext import tbhpc_wire as wire

TOKEN = "t" * 43
DELAY_S = 0.15          # how long after wait() returns each collective's data lands


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"embed.weight": torch.randn(300, 64, generator=g).to(torch.bfloat16),
            "layer.norm.weight": torch.randn(64, generator=g),
            "lm_head.weight": torch.randn(300, 64, generator=g).to(torch.bfloat16)}   # the head travels alone, last


META = [wire.meta_of(n, t) for n, t in _state().items()]
BUCKET = 20_000        # buckets: [embed], [norm], [head]


def _receiver(port: int, fail_after: int, refuse: str, out) -> None:
    """A vLLM worker's side (tbhpc_vllm_worker.tbhpc_receive without vLLM): join, take the stream into
    `load`, which keeps the tensors it was given, as vLLM's loader copies them; read them afterwards."""
    torch.set_num_threads(1)
    nccl_standin.install(wire, DELAY_S, refuse)
    group, why_not = wire.join("127.0.0.1", port, 1, 2, "cpu", 20, TOKEN)
    if group is None:
        out.put({"why_not": why_not, "events": nccl_standin.EVENTS})
        return
    kept = {}

    def load(stream):
        for i, (name, t) in enumerate(stream):
            if i == fail_after:
                raise RuntimeError("the loader broke on " + name)
            kept[name] = t                  # no copy: the buffer the collective fills
        return {"loaded": len(kept)}

    report = wire.take(group, META, BUCKET, load)
    out.put({"report": report, "sums": {n: t.float().sum().item() for n, t in kept.items()},
             "events": list(nccl_standin.EVENTS)})


def _start(sender_port: int, fail_after: int = -1, refuse: str = ""):
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=_receiver, args=(sender_port, fail_after, refuse, out))
    proc.start()
    return proc, out


@pytest.fixture()
def standin(monkeypatch):
    nccl_standin.EVENTS.clear()
    monkeypatch.setattr(wire, "process_group", wire.process_group)      # restored after the test
    return lambda refuse="": nccl_standin.install(wire, DELAY_S, refuse)


def test_the_last_bucket_lands_before_the_group_is_dropped_and_timings_include_it(standin):
    standin()
    state = _state()
    sender = wire.listen("127.0.0.1", 2, "cpu", 20, TOKEN)
    proc, out = _start(sender.port)
    assert sender.wait_joined(60)
    t0 = time.monotonic()
    sent = wire.send(sender, META, state.values(), BUCKET)
    stream_s = time.monotonic() - t0
    got = out.get(timeout=60)
    proc.join(30)
    assert sent == sum(wire.nbytes(m) for m in META)
    assert got["sums"] == {n: t.float().sum().item() for n, t in state.items()}, "a bucket had not landed when read"
    assert got["report"]["bytes"] == sent and "failed" not in got["report"], got["report"]
    # 3 buckets and the closing byte land DELAY_S apart each: the timings are of landed data
    assert stream_s >= 4 * DELAY_S and got["report"]["receive_s"] >= 4 * DELAY_S, (stream_s, got["report"])
    assert "aborted in flight" not in got["events"] + nccl_standin.EVENTS
    assert "shutdown" in got["events"] and "shutdown" in nccl_standin.EVENTS


def test_a_receiver_whose_loader_fails_takes_the_rest_of_the_stream_and_nobody_hangs(standin):
    standin()
    sender = wire.listen("127.0.0.1", 2, "cpu", 20, TOKEN)
    proc, out = _start(sender.port, fail_after=1)
    assert sender.wait_joined(60)
    t0 = time.monotonic()
    sent = wire.send(sender, META, _state().values(), BUCKET)        # completes: the receiver drained
    got = out.get(timeout=60)
    proc.join(30)
    assert time.monotonic() - t0 < 10 and sent == sum(wire.nbytes(m) for m in META)
    assert got["report"]["failed"] == "RuntimeError: the loader broke on layer.norm.weight", got["report"]
    events = got["events"] + nccl_standin.EVENTS
    assert not [e for e in events if e.startswith("mismatch")] and "aborted in flight" not in events, events


def test_a_sender_whose_stream_fails_runs_every_bucket_and_the_receiver_is_told(standin):
    standin()
    sender = wire.listen("127.0.0.1", 2, "cpu", 20, TOKEN)
    proc, out = _start(sender.port)
    assert sender.wait_joined(60)

    def tensors():
        state = _state()
        yield state["embed.weight"]
        raise RuntimeError("a ZeRO-3 gather failed")

    with pytest.raises(RuntimeError, match="a ZeRO-3 gather failed"):
        wire.send(sender, META, tensors(), BUCKET)
    got = out.get(timeout=60)
    proc.join(30)
    assert "the sender's stream failed part way" in got["report"]["failed"], got["report"]
    events = got["events"] + nccl_standin.EVENTS
    assert not [e for e in events if e.startswith("mismatch")] and "aborted in flight" not in events, events


def test_a_group_nccl_refuses_sends_both_sides_to_files_and_raises_nowhere(standin, tmp_path):
    """Different NCCL versions in the trainer's and the serving environment: NCCL's init refuses the
    group at its first collective (DistBackendError) on every member."""
    why = "NCCL error in: ProcessGroupNCCL.cpp:1967, invalid usage, NCCL version 2.27.7: Mismatched NCCL version detected"
    standin(why)
    ensure_token(tmp_path)
    sender = Sender(tmp_path, 4, META, 1, "cpu", 20, BUCKET, host="127.0.0.1")
    assert latest_offer(tmp_path) is not None
    proc, out = _start(sender.group.port, refuse=why)
    assert sender.wait_joined(30) is False
    got = out.get(timeout=60)
    proc.join(30)
    assert sender.refused.startswith("weight broadcast: the group did not form (DistBackendError: NCCL error in")
    assert not offer_path(tmp_path, 4).exists()                  # withdrawn: the trainer publishes files
    assert got["why_not"]["unjoined"].startswith("DistBackendError: NCCL error in"), got
