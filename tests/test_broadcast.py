"""Weight sync by broadcast without vLLM: the wire (serve/vllm_ext/tbhpc_wire.py) between real
processes over gloo, and the protocol (serve/broadcast.py) between a sender and the real
Supervisor, whose server is replaced by `Receiver` (it joins the offer's group for real and keeps
what arrives; a vLLM server takes a minute to start: the real one is in tests/test_vllm.py)."""
import multiprocessing as mp
import threading
import time

import pytest
import torch

from tbhpc.serve import supervisor as sup_mod
from tbhpc.serve.auth import ensure_token, read_token
from tbhpc.serve import verify as verify_mod
from tbhpc.serve.broadcast import Sender, digesting, latest_offer, offer_path
from tbhpc.serve.checkpoints import mark_ready, read_syncs
from tbhpc.serve.config import ServeConfig
from tbhpc.serve.digest import digest_table, state_digest
from tbhpc.serve.endpoint import read_endpoint, wait_for_version
from tbhpc.serve.fingerprint import Check, Fingerprint
from tbhpc.serve.server import UntrustedGroup
from tbhpc.serve.vllm_ext import tbhpc_wire as wire


def _state(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"embed.weight": torch.randn(300, 64, generator=g).to(torch.bfloat16),
            "layer.norm.weight": torch.randn(64, generator=g),
            "layer.proj.weight": torch.randn(64, 128, generator=g).to(torch.float16),
            "steps": torch.arange(5)}


TOKEN = "t" * 43          # a run's token, as auth.py makes them (43 url-safe characters)


def _receive(port: int, world: int, rank: int, meta: list, out) -> None:
    torch.set_num_threads(1)
    g = wire.Group("127.0.0.1", port, rank, world, "cpu", 60, TOKEN).join()
    got = {n: t.clone() for n, t in wire.receive(g, meta, bucket_bytes=20_000)}
    g.close()
    out.put((rank, {n: (t.dtype, t.shape, t.float().sum().item(), t.view(-1).view(torch.uint8).sum().item())
                    for n, t in got.items()}))


def test_the_wire_delivers_every_tensor_bit_for_bit_to_every_receiver_in_buckets():
    state = _state(0)
    meta = [wire.meta_of(n, t) for n, t in state.items()]
    buckets = wire.plan_buckets(meta, 20_000)
    assert buckets == [[0], [1, 2, 3]]      # 38,400 B alone; then 256 + 16,384 + 40 B in one bucket
    sender = wire.listen("127.0.0.1", 3, "cpu", 60, TOKEN)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_receive, args=(sender.port, 3, r, meta, out)) for r in (1, 2)]
    for p in procs:
        p.start()
    assert sender.wait_joined(60)
    sent = wire.send(sender, meta, state.values(), bucket_bytes=20_000)
    sender.close()
    got = dict(out.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(30)
    assert sent == sum(wire.nbytes(m) for m in meta) == sum(t.numel() * t.element_size() for t in state.values())
    want = {n: (t.dtype, t.shape, t.float().sum().item(), t.view(-1).view(torch.uint8).sum().item()) for n, t in state.items()}
    assert got == {1: want, 2: want}
    with pytest.raises(ValueError, match="layer.norm.weight is \\(3,\\) torch.float32, announced \\(64,\\) float32"):
        wire.send(wire.listen("127.0.0.1", 1, "cpu", 5, TOKEN), meta[:2], [state["embed.weight"], torch.zeros(3)])
    with pytest.raises(ValueError, match="no run token"):
        wire.listen("127.0.0.1", 2, "cpu", 5, "")


def test_an_offer_nobody_takes_is_withdrawn_in_bounded_time(tmp_path):
    ensure_token(tmp_path)
    meta = [wire.meta_of(n, t) for n, t in _state(0).items()]
    sender = Sender(tmp_path, 3, meta, receivers=2, device="cpu", timeout_s=30, bucket_bytes=1 << 20, host="127.0.0.1")
    offer = latest_offer(tmp_path)
    assert offer is not None and offer.step == 3 and offer.world == 3 and offer.port == sender.group.port
    assert offer.nbytes == sum(wire.nbytes(m) for m in meta)
    t0 = time.monotonic()
    assert sender.wait_joined(0.5) is False and time.monotonic() - t0 < 5
    assert not offer_path(tmp_path, 3).exists() and latest_offer(tmp_path) is None


class Receiver:
    """The vLLM server's stand-in: `receive` joins the offer's group as worker 1 and keeps the tensors."""

    def __init__(self, run, skip: bool = False):
        self.token = read_token(ensure_token(run))     # what a worker reads from TBHPC_TOKEN_FILE
        self.held: dict = {}
        self.version = "base"
        self.skip = skip
        self.proc = type("P", (), {"pid": 100, "poll": lambda self: None})()
        self.port, self.base_url, self.client, self.started_at = 9000, "http://fake", "client of http://fake", 0.0

    def receive(self, offer, version):
        try:
            g = wire.Group(offer.host, offer.port, 1, offer.world, "cpu", offer.timeout_s, self.token).join()
        except PermissionError as exc:        # as VLLMServer.receive turns its workers' reports
            raise UntrustedGroup(str(exc)) from None
        got = {n: t.clone() for n, t in wire.receive(g, offer.meta, offer.bucket_bytes)}
        g.close()
        if not self.skip:
            self.held = got
        self.version = version
        return {"bytes": sum(t.numel() * t.element_size() for t in got.values()), "join_s": 0.01, "receive_s": 0.02}

    def set_version(self, v):
        self.version = v

    def weight_version(self):
        return self.version

    def stop(self):
        pass


def test_a_broadcast_sync_is_checked_like_a_file_sync_and_a_stream_that_loads_nothing_is_refused(tmp_path, monkeypatch):
    fake = Receiver(tmp_path)
    s = sup_mod.Supervisor(tmp_path, ServeConfig(model="/base", device="cpu", on_mismatch="refuse"), log=lambda m: None)

    def launch(model, port):
        s.server, s.kernels = fake, {"paths": {"torch": 3}, "dtype": "bfloat16"}

    monkeypatch.setattr(s, "_launch", launch)
    monkeypatch.setattr(verify_mod, "served_digest", lambda url, report_dir=None, replicas=0, adapter=False: {
        **state_digest(fake.held, "bfloat16"), "tensors": {n: {"shape": list(t.shape), "param": h} for (n, t), h in
                                                          zip(fake.held.items(), state_digest(fake.held, "bfloat16")["tensors"].values())}})
    monkeypatch.setattr(verify_mod, "check_server",
                        lambda url, model, fp, version, tol: Check(version, 0.0, 0.0, tol, len(fp.logprobs), 0.01, fp.logprobs))
    s.start()
    assert read_endpoint(tmp_path).workers == 1 and read_endpoint(tmp_path).device == "cpu"
    fp = Fingerprint([1, 2, 3], [-1.0, -2.0], "float32")

    def publish(step: int, state: dict) -> None:
        """What train/publish.py does on rank 0: offer, wait, stream with digests, mark ready."""
        meta = [wire.meta_of(n, t) for n, t in state.items() if t.is_floating_point()]
        sender = Sender(tmp_path, step, meta, 1, "cpu", 30, 20_000, host="127.0.0.1")
        assert sender.wait_joined(30)
        digests: dict = {}
        sender.send(digesting(((m["name"], state[m["name"]]) for m in meta), "bfloat16", digests))
        mark_ready(tmp_path, step, None, fp, {"bfloat16": digest_table(digests, "bfloat16")}, transport="broadcast")

    for step, skip in ((1, False), (2, True)):
        fake.skip = skip
        worker = threading.Thread(target=publish, args=(step, _state(step)))
        worker.start()
        deadline = time.monotonic() + 30
        entry = None
        while entry is None and time.monotonic() < deadline:
            entry = s.sync_if_new()
            time.sleep(0.05)
        worker.join(30)
        assert entry is not None and entry["mode"] == "broadcast" and entry["step"] == step
        assert entry["broadcast"]["bytes"] == sum(t.numel() * t.element_size() for t in _state(step).values()
                                                  if t.is_floating_point())
        assert not offer_path(tmp_path, step).exists()            # the sender withdraws it when the stream ends
        if not skip:
            assert entry["verified"] is True and entry["digest_equal"] is True and entry["path"] is None
            assert wait_for_version(tmp_path, "step-000001", timeout_s=1).version == "step-000001"
        else:       # received, never loaded: the probe could not tell, the digest does
            assert entry["verified"] is False and entry["digest_mismatch"].startswith("embed.weight")
            assert read_endpoint(tmp_path).version == "rejected:step-000002"
    assert [e["transport"] for e in read_syncs(tmp_path)] == ["broadcast", "broadcast"]
    assert s.sync_if_new() is None                    # nothing newer: no file marker, no open offer


def test_a_stranger_in_the_group_gets_no_weights_and_the_server_keeps_what_it_serves(tmp_path, monkeypatch):
    """Someone without the run's token joins a sync's group (the TCPStore takes anyone): every member's
    proof is checked before a byte moves, so the sender sends nothing and falls back to files, the
    stranger and the server's worker both learn the group is not trusted, and the server keeps
    serving its verified version and does not retry that offer."""
    fake = Receiver(tmp_path)
    s = sup_mod.Supervisor(tmp_path, ServeConfig(model="/base", device="cpu"), log=lambda m: None)
    monkeypatch.setattr(s, "_launch", lambda model, port: setattr(s, "server", fake))
    s.start()
    meta = [wire.meta_of(n, t) for n, t in _state(1).items() if t.is_floating_point()]
    sender = Sender(tmp_path, 1, meta, 2, "cpu", 30, 20_000, host="127.0.0.1")     # the server's worker + one slot
    stranger: dict = {}

    def intrude():
        try:
            wire.Group("127.0.0.1", sender.offer.port, 2, 3, "cpu", 30, "s" * 43).join()
        except PermissionError as exc:
            stranger["refused"] = str(exc)

    threads = [threading.Thread(target=intrude), threading.Thread(target=lambda: stranger.update(entry=s.sync_if_new()))]
    for t in threads:
        t.start()
    assert sender.wait_joined(30) is False
    for t in threads:
        t.join(30)
    assert sender.refused == "weight broadcast: group rank(s) [2] of 3 did not prove the run's token; nothing was sent"
    assert "rank(s) [0, 1] of 3" in stranger["refused"] and not offer_path(tmp_path, 1).exists()   # its view: the others
    entry = stranger["entry"]
    assert entry["untrusted"] == sender.refused and entry["served_as"] == "base" and entry["verified"] is False
    assert fake.held == {} and read_endpoint(tmp_path).version == "base" == fake.version   # nothing loaded, nothing announced
    assert s.sync_if_new() is None
