"""Bounded k-step asynchronous GRPO (`max_staleness: k`), the parts a CPU test can pin exactly:

- admission (train/window.py): over random sync, update and draw timings, no token is ever more
  than k versions behind the step that trains on it, and a looser rule is caught by the same check;
- the loss at current versions is exactly the on-policy loss, with or without the truncation cap;
- a turn a weight sync interrupted is issued again and only the re-issued tokens are kept (the
  generator's re-issue, against a stand-in for vLLM's generate route: an abort or an unverified
  version cannot be produced on cue by a real server);
- per-token versions survive the rollout buffer; decided groups survive a preemption (pending).

The whole loop with k = 2 (in process, stopped and resumed) is tests/test_train_offpolicy.py; with
the vLLM job on the local cluster, tests/test_make_train.py.
"""
import json
import random
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
import torch

from tbhpc.errors import EndpointError
from tbhpc.policy.generation import ServerGenerator
from tbhpc.policy.sampling import Sampling
from tbhpc.rollout.buffer import Episode, read_step, write_step
from tbhpc.train.grpo import policy_loss
from tbhpc.train.packing import pack
from tbhpc.train.window import Window, admission_version, staleness


# ---- admission -------------------------------------------------------------------------------

class SimServer:
    """The served version over time: `announce(v)` after a sync; `load(n)` blocks until a version
    >= n is served (what ServerWeights.load waits for); `now()` is what a token sampled now gets."""

    def __init__(self):
        self.version, self.cond = 0, threading.Condition()

    def announce(self, v: int) -> None:
        with self.cond:
            self.version = max(self.version, v)
            self.cond.notify_all()

    def load(self, n: int) -> None:
        with self.cond:
            self.cond.wait_for(lambda: self.version >= n)

    def now(self) -> int:
        with self.cond:
            return self.version


def simulate(k: int, seed: int, steps: int = 12, admit=admission_version) -> list[tuple[int, int]]:
    """A trainer loop over the real Window: each step's rollouts wait for admission, then sample
    tokens at random moments (versions read from the server at that moment), while earlier steps
    update and publish; each publication is served after a random sync delay. Returns
    (step, version) of every token."""
    rng = random.Random(seed)
    delays = {s: [rng.uniform(0, 0.002) for _ in range(6)] for s in range(1, steps + 1)}
    update = {s: rng.uniform(0, 0.002) for s in range(1, steps + 1)}
    sync = {s: rng.uniform(0, 0.004) for s in range(1, steps + 1)}
    server = SimServer()

    def rollouts(step: int) -> list[int]:
        server.load(admit(step, k))
        tokens = []
        for d in delays[step]:
            time.sleep(d)
            tokens.append(server.now())
        return tokens

    window = Window(rollouts, steps, serial=False)
    window.fill(k)
    seen = []
    syncs = []
    for step in range(1, steps + 1):
        seen += [(step, v) for v in window.take(step)]
        window.fill(step + k)
        time.sleep(update[step])
        t = threading.Timer(sync[step], server.announce, args=(step,))
        t.start()
        syncs.append(t)
    for t in syncs:
        t.join()
    return seen


@pytest.mark.parametrize("k", [0, 1, 2, 3])
def test_admission_never_lets_a_token_exceed_the_bound(k):
    worst = 0
    for seed in range(25):
        tokens = simulate(k, seed)
        ages = [staleness(step, v) for step, v in tokens]
        assert max(ages) <= k, (seed, max(ages))
        assert min(ages) >= 0                   # no token from weights newer than the step's start
        worst = max(worst, max(ages))
    assert worst == k or k == 0, worst          # the bound is reached, not just respected from afar


def test_the_check_catches_admission_one_version_too_loose():
    """The same simulation with admission one version looser than the rule: tokens k+1 old show up."""
    k = 2
    ages = [staleness(s, v) for seed in range(25) for s, v in simulate(k, seed, admit=lambda step, k: admission_version(step, k + 1))]
    assert max(ages) == k + 1


def test_in_process_steps_take_turns_in_the_window():
    """serial=True: step t's rollouts start after step t-1's ended (one set of weights in process)."""
    spans, lock = {}, threading.Lock()

    def rollouts(step):
        t0 = time.monotonic()
        time.sleep(0.02)
        with lock:
            spans[step] = (t0, time.monotonic())
        return step

    window = Window(rollouts, 4, serial=True)
    window.fill(3)
    assert [window.take(s) for s in (1, 2, 3)] == [1, 2, 3]
    window.fill(4)
    assert window.take(4) == 4
    for s in (2, 3):
        assert spans[s][0] >= spans[s - 1][1], spans


# ---- the loss ------------------------------------------------------------------------------------

def _loss_and_grad(lp0, mu, adv, mask, **kw):
    lp = lp0.clone().requires_grad_(True)
    loss, st = policy_loss(lp, mu, adv, mask, global_loss_tokens=float(mask.sum()), **kw)
    loss.backward()
    return float(loss.detach()), lp.grad.clone(), st


def test_the_loss_at_current_versions_is_the_on_policy_loss_exactly():
    """Every token sampled by the weights being updated (staleness 0): with the truncation cap on
    (k >= 2's default) the loss and its gradient are bit for bit the plain PPO-clip ones, even with
    an engine mismatch wide enough for the clip to act; stale tokens take the decoupled weight."""
    g = torch.Generator().manual_seed(0)
    lp0 = -torch.rand(64, generator=g) * 3
    mu = lp0 + torch.randn(64, generator=g) * 0.3          # some ratios outside the clip band
    adv = torch.randn(64, generator=g)
    mask = (torch.rand(64, generator=g) > 0.2).float()
    plain = _loss_and_grad(lp0, mu, adv, mask)
    current = torch.where(mask > 0, 0, -1)
    capped = _loss_and_grad(lp0, mu, adv, mask, tis_cap=2.0, staleness=current, buckets=3)
    assert plain[0] == capped[0] and torch.equal(plain[1], capped[1])
    assert capped[2].truncated == 0.0 and capped[2].by_staleness[0][0] == float(mask.sum())
    stale = torch.where(mask > 0, 2, -1)
    decoupled = _loss_and_grad(lp0, mu, adv, mask, tis_cap=2.0, staleness=stale, buckets=3)
    assert not torch.equal(plain[1], decoupled[1])           # the stale tokens' gradient is the decoupled one
    weight = torch.clamp(torch.exp(lp0 - mu), max=2.0)
    want = -adv * weight * mask / float(mask.sum())           # -A x min(pi/mu, C) x grad log pi / tokens
    assert torch.allclose(decoupled[1], want, atol=1e-6)
    split = decoupled[2].by_staleness
    assert split[2][0] == float(mask.sum()) and split[0][0] == split[1][0] == 0
    assert split[2][2] == float((((lp0 - mu).exp() > 2.0) & (mask > 0)).sum())


def test_pack_gives_each_loss_token_its_staleness():
    a = Episode([1, 2, 3, 4], [0, 1, 1, 0], [0, -.1, -.2, 0], group=0, reward=1, versions=[-1, 3, 5, -1])
    b = Episode([5, 6, 7], [0, 0, 1], [0, 0, -.3], group=0, reward=0, policy_version=4)
    (p,) = pack([a, b], [0.5, -0.5], budget=100, trained_version=5)
    # targets are tokens 1..; b's first token is never a target of a's last
    assert p.staleness.tolist() == [2, 0, -1, -1, -1, 1]


# ---- re-issued turns ----------------------------------------------------------------------------

class StandIn(BaseHTTPRequestHandler):
    """Stands in for vLLM's /inference/v1/generate and /weight_info: answers from scripted queues
    (a real server cannot be made to abort, or to sample under an unverified version, on cue)."""
    answers: list = []
    served: list = []
    requests: list = []
    asked: list = []

    def log_message(self, *args):
        pass

    def _send(self, payload):
        body = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append(body)
        ids, lps, finish, spans = type(self).answers.pop(0)
        self._send({"choices": [{"token_ids": ids, "finish_reason": finish, "weight_versions": spans,
                                 "logprobs": {"content": [{"logprob": x} for x in lps]}}]})

    def do_GET(self):
        served = type(self).served
        type(self).asked.append(served[0])
        self._send({"weight_version": served.pop(0) if len(served) > 1 else served[0]})


@pytest.fixture
def stand_in():
    StandIn.answers, StandIn.served, StandIn.requests, StandIn.asked = [], [], [], []
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def _span(v, a, b):
    return {"version": v, "start": a, "end": b}


def test_a_turn_aborted_by_a_sync_is_issued_again_and_only_its_tokens_are_kept(stand_in):
    StandIn.answers = [([7, 8], [-1.0, -1.1], "abort", [_span("step-000001", 0, 2)]),
                       ([9, 10, 11], [-0.5, -0.6, -0.7], "stop", [_span("step-000002", 0, 3)])]
    StandIn.served = ["step-000001", "step-000002"]        # the sync's load had not begun when the abort came
    gen = ServerGenerator(stand_in, retries=0)
    g = gen.generate([1, 2, 3, 4], Sampling(max_tokens=8), seed=11)
    assert (g.token_ids, g.logprobs, g.finish_reason) == ([9, 10, 11], [-0.5, -0.6, -0.7], "stop")
    assert g.versions() == ["step-000002"] * 3 and g.version == "step-000002"
    assert (g.reissued, g.discarded, g.reprefilled) == (1, 2, 4)
    assert [r["token_ids"] for r in StandIn.requests] == [[1, 2, 3, 4]] * 2          # the same prompt
    assert {r["sampling_params"]["seed"] for r in StandIn.requests} == {11}          # and seed
    assert StandIn.asked == ["step-000001", "step-000002"]      # re-issued once the server left the aborted version


def test_a_turn_sampled_while_a_version_is_verified_waits_for_the_verdict_and_is_issued_again(stand_in):
    """`UntrustedWeights` used to drop the whole group: now the generator waits until the server
    serves a verified version, then issues the turn again."""
    StandIn.answers = [([7], [-1.0], "stop", [_span("unverified:step-000002", 0, 1)]),
                       ([9, 10], [-0.5, -0.6], "stop", [_span("step-000002", 0, 2)])]
    StandIn.served = ["unverified:step-000002", "unverified:step-000002", "step-000002"]
    g = ServerGenerator(stand_in, retries=0).generate([1, 2], Sampling(max_tokens=8), seed=3)
    assert g.token_ids == [9, 10] and g.reissued == 1
    assert StandIn.asked == ["unverified:step-000002"] * 2 + ["step-000002"]        # asked until verified


def test_a_turn_kept_across_a_sync_records_each_tokens_version(stand_in):
    """pause_mode keep: one turn, two versions; the server prefilled prompt + the tokens before the
    switch again (its prefix-cache reset preempted the request)."""
    StandIn.answers = [([5, 6, 7, 8], [-.1, -.2, -.3, -.4], "stop",
                        [_span("step-000001", 0, 3), _span("step-000002", 3, 4)])]
    g = ServerGenerator(stand_in, retries=0).generate([1, 2], Sampling(max_tokens=8), seed=3)
    assert g.versions() == ["step-000001"] * 3 + ["step-000002"]
    assert g.version == "mixed:step-000001,step-000002" and (g.reissued, g.reprefilled) == (0, 5)


def test_a_turn_aborted_again_and_again_is_an_endpoint_error(stand_in):
    StandIn.answers = [([7], [-1.0], "abort", [_span("step-000001", 0, 1)])] * 3
    StandIn.served = ["step-000002"]
    with pytest.raises(EndpointError, match="aborted by weight syncs 3 times"):
        ServerGenerator(stand_in, retries=0, max_reissues=2).generate([1], Sampling(max_tokens=8), seed=0)


# ---- records ------------------------------------------------------------------------------------

def test_per_token_versions_survive_the_rollout_buffer(tmp_path):
    e = Episode([1, 2, 3, 4, 5], [0, 1, 1, 0, 1], [0, -.1, -.2, 0, -.3], group=2, reward=1.0, policy_version=3,
                versions=[-1, 3, 3, -1, 4], reissued=1, reprefilled=40)
    (back,) = read_step(write_step(tmp_path, 5, [e]))
    assert back.versions.tolist() == [-1, 3, 3, -1, 4] and (back.reissued, back.reprefilled) == (1, 40)
    assert (back.newest_version, back.switches, back.policy_version) == (4, 1, 3)


def test_a_v1_buffer_reads_back_with_every_token_at_its_episodes_version(tmp_path):
    import h5py
    path = write_step(tmp_path, 1, [Episode([1, 2, 3], [0, 1, 1], [0, -.1, -.2], group=0, reward=0.0, policy_version=2)])
    with h5py.File(path, "a") as f:          # what files written before per-token versions hold
        del f["versions"]
        for k in ("newest_version", "switches", "reissued", "reprefilled"):
            del f["episodes"][k]
    (back,) = read_step(path)
    assert back.versions.tolist() == [-1, 2, 2] and back.reissued == 0


def test_pending_groups_outlive_a_stop_unless_discarded_weights_sampled_them(tmp_path):
    from types import SimpleNamespace

    from tbhpc.train.pending import PendingGroups

    def group(index, versions):
        ep = Episode(np.arange(len(versions)), [1] * len(versions), [0.0] * len(versions), group=index, reward=1.0,
                     policy_version=min(versions), versions=versions)
        return SimpleNamespace(index=index, rollouts=[SimpleNamespace(samples=[ep])], status="mixed")

    pending = PendingGroups(tmp_path)
    pending.save(3, group(0, [1, 2]))       # step 3, sampled by versions 1 and 2
    pending.save(4, group(0, [2, 2]))
    pending.save(4, group(1, [2, 3]))       # version 3: published after the checkpoint resumed from
    pending.save(2, group(0, [1]))          # a trained step
    assert pending.resume(trained=2) == 2
    assert pending.load(2, 0) is None and pending.load(4, 1) is None
    assert pending.load(3, 0).rollouts[0].samples[0].versions.tolist() == [1, 2] and pending.load(4, 0) is not None
    pending.done(3)
    assert pending.load(3, 0) is None


# ---- the scaling model ----------------------------------------------------------------------------

def test_the_model_puts_k_2_at_least_1_7x_ahead_of_k_1_at_the_reference_and_plan_recommends_a_k(monkeypatch):
    """jobs/train-reference.yaml on jobs/plan/h100-27b.yaml (27B, 2 trainer nodes + a serving node
    of 3 x 8 H100): a step is set by its 677 s episode at k = 1; k = 2 shares it between two steps.
    Predictions, not measurements (tbhpc plan prints them as such). k = 1 is the one-step-off-policy
    formula, max(rollout + sync, update + publish), unchanged."""
    import os
    from pathlib import Path

    from tbhpc.config import load_config
    from tbhpc.launch.train import serve_config_for
    from tbhpc.plan.model import Cluster, Workload, phases, step_time
    from tbhpc.plan.staleness import render, staleness_plan
    from tbhpc.train.config import TrainConfig
    repo = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(repo)
    cfg = load_config(TrainConfig, repo / "jobs/train-reference.yaml", ["model=jobs/models/qwen3-27b-class"])
    p = staleness_plan(cfg, Path("jobs/plan/h100-27b.yaml"), serve_config_for(cfg))
    assert p.steps[1] / p.steps[2] >= 1.7 and p.recommended >= 2 and p.configured == 0
    assert 670 < p.tail_s < 690 and p.steps[0] > p.steps[1] > p.steps[2] >= p.steps[3]
    text = "\n".join(render(p)) + "\n"
    golden = repo / "tests" / "golden" / "plan_staleness_reference.txt"
    if os.environ.get("TBHPC_UPDATE_GOLDEN"):
        golden.write_text(text)
    assert text == golden.read_text()
    w, c = Workload(), Cluster(in_flight=16)
    rollout, update, publish, sync = phases(w, c)
    assert step_time(w, c, 1).step_s == max(rollout + sync, update + publish)
    assert step_time(w, Cluster(shared_compute=True), 2).step_s == step_time(w, Cluster(shared_compute=True), 0).step_s


def test_the_training_report_splits_each_step_by_staleness():
    from tbhpc.report.train import staleness_markdown
    rows = [{"step": 1, "max_staleness": 0}, {"step": 3, "max_staleness": 2, "staleness_tokens": [10, 30, 60],
            "clip_by_staleness": [0, 0.1, 0.2], "truncated_by_staleness": [0, 0, 0.05],
            "mismatch_by_staleness": [1e-3, 2e-3, 3e-3], "spanning": 2, "reissued": 1, "reprefilled": 900}]
    lines = staleness_markdown(rows).splitlines()
    assert lines[0].startswith("| step | age 0 tokens | age 1 tokens | age 2 tokens | clip 0 |") and len(lines) == 3
    assert lines[2] == ("| 3 | 10 (10%) | 30 (30%) | 60 (60%) | 0.000 | 0.100 | 0.200 | 0.000 | 0.000 | 0.050 | "
                        "1.00e-03 | 2.00e-03 | 3.00e-03 | 2 | 1 | 900 |")
    assert staleness_markdown(rows[:1]) == ""          # on-policy: no section


def test_the_async_bench_table_pairs_each_arm_with_k_1_of_its_block():
    """bench/async_k.py's pure parts: the machine's CPU clock, and the table of ratios against k = 1 of the
    same block (median and spread over blocks) beside the model's predicted ratios."""
    import importlib.util
    from pathlib import Path
    spec = importlib.util.spec_from_file_location("async_k", Path(__file__).resolve().parents[1] / "bench" / "async_k.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    before = bench.busy_cpu_seconds()
    sum(i * i for i in range(3_000_000))                  # ~0.2 s of this process's CPU
    assert bench.busy_cpu_seconds() - before > 0.05
    rows = [{"workload": w, "k": k, "tag": f"b{b}", "step_s": s, "middle_s": s - 1, "kept_per_s": 0.1, "cpu_s_per_token": 1e-3,
             "server_idle": 0.5, "reward": 0.2 + 0.01 * k, "spanning": k, "reissued": 0}
            for w in ("heavy", "control") for b, scale in ((0, 1.0), (1, 1.2)) for k, s in ((1, 20 * scale), (2, 10 * scale))]
    predicted = {"workloads": {w: {"ratio_vs_k1": {1: 1.0, 2: 1.8}, "step_s": {"1": 30.0, "2": 16.7}} for w in ("heavy", "control")}}
    table = bench.report(rows, predicted, [1, 2], Path("."))
    heavy2 = next(line for line in table.splitlines() if line.startswith("| heavy | 2 |"))
    assert "| 11.0; 10.0, 12.0 | 2.00 (2.00-2.00) | 1.80 | 16.7 | 9.0, 11.0 |" in heavy2 and "(+0.010)" in heavy2, heavy2
    assert [bench.middle_steps(k, 8) for k in range(4)] == [7, 5, 3, 1]      # steps k+2 .. N-k
