"""`tbhpc grad-noise`: the signal/noise statistics recover known values, the per-group gradient is
the trainer's GRPO gradient, and the command reads a run's buffers end to end."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from tbhpc.errors import UserError
from tbhpc.rollout.buffer import Episode, write_step
from tbhpc.train.gradnoise import group_gradients, informative_groups, noise_of, report, token_mask

REPO = Path(__file__).resolve().parents[1]


def test_statistics_recover_a_known_signal_and_noise():
    rng = np.random.default_rng(0)
    n, dim, sigma = 400, 2000, 1.0
    signal = rng.normal(size=dim) * 0.1                      # |s|^2 ~ 20; noise per group ~ 2000
    grads = signal + rng.normal(scale=sigma, size=(n, dim))
    got = noise_of(grads)
    assert got.noise == pytest.approx(dim * sigma ** 2, rel=0.02)
    assert got.signal == pytest.approx(float(signal @ signal), rel=0.25)
    assert got.groups_for_snr1 == pytest.approx(dim / float(signal @ signal), rel=0.3)
    expected = got.step_cos(n // 2)                          # the halves are two steps of n/2 groups
    assert got.split_cos == pytest.approx(expected, abs=0.05)
    assert 0 < got.step_cos(4) < got.step_cos(400) < 1


def test_pure_noise_has_no_detectable_signal():
    grads = np.random.default_rng(1).normal(size=(50, 500))
    got = noise_of(grads)
    assert abs(got.signal) < 0.5 * got.noise / 50           # ~8 standard errors of the estimate around zero
    assert abs(got.split_cos) < 0.1
    text = report(got, 18, "x")
    assert "groups per step" in text and "x" in text.splitlines()[0]


def test_statistics_refuse_fewer_than_two_groups():
    with pytest.raises(ValueError, match="at least 2"):
        noise_of(np.zeros((1, 3)))


def _episodes(vocab: int, seed: int, group: int, rewards) -> list[Episode]:
    rng = np.random.default_rng(seed)
    out = []
    for k, r in enumerate(rewards):
        n = 30 + 7 * k
        mask = np.zeros(n, np.uint8)
        mask[10:] = 1
        out.append(Episode(rng.integers(0, vocab, n), mask, np.zeros(n), group, float(r), float(r - np.mean(rewards)),
                           task_id=f"t{group}", attempt_key=f"t{group}:{k}"))
    return out


def test_group_gradient_is_the_trainers_on_policy_grpo_gradient(tiny_dir):
    import torch
    from transformers import AutoModelForCausalLM

    from tbhpc.train.grpo import policy_loss
    from tbhpc.train.logprobs import token_logprobs
    from tbhpc.train.packing import effective_budget, pack
    model = AutoModelForCausalLM.from_pretrained(str(tiny_dir), dtype=torch.float32)
    eps = _episodes(model.config.vocab_size, 0, 0, [1, 0, 0, 1])
    mine = group_gradients(model, [eps])[0]
    model.zero_grad(set_to_none=True)
    for mb in pack(eps, [e.advantage for e in eps], effective_budget(10_000, [len(e.tokens) for e in eps], None)):
        lp = token_logprobs(model, mb)
        loss, _ = policy_loss(lp, lp.detach(), mb.advantages, mb.loss_mask, global_loss_tokens=1.0)
        loss.backward()
    trainer = torch.cat([p.grad.flatten() for p in model.parameters()]).numpy()
    assert np.abs(mine - trainer).max() <= 1e-4 * np.abs(trainer).max()
    tempered = group_gradients(model, [eps], temperature=0.5)[0]     # another policy: another gradient
    assert np.abs(tempered - mine).max() > 1e-3 * np.abs(mine).max()


def test_grad_noise_command_reads_a_runs_buffers(tiny_dir, tmp_path):
    from transformers import AutoConfig
    vocab = AutoConfig.from_pretrained(str(tiny_dir)).vocab_size
    run = tmp_path / "run"
    (run / "buffers").mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump({"model": str(tiny_dir), "groups_per_step": 2}))
    write_step(run / "buffers", 1, _episodes(vocab, 1, 0, [1, 0, 1, 0]) + _episodes(vocab, 2, 1, [0, 0, 0, 0]))
    write_step(run / "buffers", 2, _episodes(vocab, 3, 2, [1, 1, 0, 0]), suffix=".rank0")
    write_step(run / "buffers", 2, _episodes(vocab, 4, 3, [0, 1, 0, 0]), suffix=".rank1")
    groups = informative_groups(run / "buffers", [1, 2])
    assert [g[0].group for g in groups] == [0, 2, 3]          # the flat group 1 carries no gradient
    out = subprocess.run([sys.executable, "-m", "tbhpc.cli", "grad-noise", str(run), "--steps", "1-2", "--threads", "1"],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "3 informative groups" in out.stdout and "two steps of 2 groups" not in out.stdout
    assert "cosine of two independent steps of 2 groups" in out.stdout
    choices = subprocess.run([sys.executable, "-m", "tbhpc.cli", "grad-noise", str(run), "--steps", "1-2", "--threads", "1",
                              "--tokens", "choices"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert choices.returncode == 0 and "1-2, choices tokens: 3 informative groups" in choices.stdout, choices.stderr
    wrong = subprocess.run([sys.executable, "-m", "tbhpc.cli", "grad-noise", str(run), "--tokens", "verbs"],
                           cwd=REPO, capture_output=True, text=True, timeout=120)
    assert wrong.returncode == 2 and wrong.stderr.count("\n") == 1 and "--tokens must be one of" in wrong.stderr
    bad = subprocess.run([sys.executable, "-m", "tbhpc.cli", "grad-noise", str(run), "--steps", "7"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "no buffer file for step 7" in bad.stderr


def test_token_classes_split_the_loss_tokens():
    """choices + confident and tool-calls + text each partition the generated tokens; a call's
    markers count as part of it; prompt tokens are in no class."""
    OPEN, CLOSE = 90, 91
    tokens = np.array([1, 2, 3, 4, OPEN, 5, 6, CLOSE, 7, 8, OPEN, 9, CLOSE])
    mask = np.array([0, 0, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1], np.uint8)
    probs = np.array([1, 1, .5, .95, .99, .3, .97, .999, .2, 1, .8, .6, 1.0])
    e = Episode(tokens, mask, np.log(probs), 0, 1.0, 0.5)
    cls = {c: token_mask(e, c, OPEN, CLOSE) for c in ("all", "choices", "confident", "tool-calls", "text")}
    assert cls["all"].tolist() == mask.astype(bool).tolist()
    assert np.flatnonzero(cls["choices"]).tolist() == [2, 5, 8, 10, 11]
    assert (cls["choices"] ^ cls["confident"]).tolist() == cls["all"].tolist() and not (cls["choices"] & cls["confident"]).any()
    assert np.flatnonzero(cls["tool-calls"]).tolist() == [4, 5, 6, 7, 10, 11, 12]
    assert np.flatnonzero(cls["text"]).tolist() == [2, 3, 8]
    with pytest.raises(UserError, match="no <tool_call>"):
        token_mask(e, "text")
    with pytest.raises(UserError, match="must be one of"):
        token_mask(e, "nouns", OPEN, CLOSE)
