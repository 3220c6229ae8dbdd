"""RFT (train/rft.py): which groups it keeps, what it trains on, its loss; then a real `tbhpc train
algorithm=rft` step whose update is checked against plain supervised fine-tuning on the step's
passed episodes, computed here independently."""
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch

from tbhpc.train import rft
from tbhpc.train.grpo import policy_loss


@dataclass
class _Ep:
    reward: float
    finish_reason: str = "done"


@dataclass
class _Rollout:
    episode: _Ep
    samples: list = field(default_factory=list)


@dataclass
class _Group:
    rollouts: list


@dataclass
class _Sample:
    name: str
    advantage: float = 0.0


def _group(rewards, name="g"):
    return _Group([_Rollout(_Ep(r), [_Sample(f"{name}{i}")]) for i, r in enumerate(rewards)])


def test_rft_keeps_every_group_with_a_pass_and_trains_on_the_passes_only():
    assert not rft.keeps(_group([0, 0, 0, 0]).rollouts)
    assert rft.keeps(_group([0, 1, 0, 0]).rollouts) and rft.keeps(_group([1, 1, 1, 1]).rollouts)   # all-pass: kept
    mixed, full = _group([0, 1, 0, 1], "m"), _group([1, 1], "f")
    full.rollouts[1].samples.append(_Sample("f1b"))            # a template rewrite: two samples of one episode
    out, weights, left = rft.samples([mixed, full])
    assert [s.name for s in out] == ["m1", "m3", "f0", "f1", "f1b"] and weights == [1.0] * 5 and left == 0
    assert all(s.advantage == 1.0 for s in out)
    out, _, left = rft.samples([mixed], overlong_filter=True, is_overlong=lambda e: e is mixed.rollouts[3].episode)
    assert [s.name for s in out] == ["m1"] and left == 1


def test_the_nll_loss_is_the_token_mean_over_the_step_and_its_gradient_is_the_policy_gradient_at_ratio_one():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 12, generator=g, requires_grad=True)
    lp = torch.log_softmax(logits, -1)[:, :6].reshape(-1)           # 12 "token" logprobs, two micro-batches of 6
    mask = torch.tensor([1, 1, 0, 1, 1, 1, 0, 0, 1, 1, 1, 0], dtype=torch.float32)
    halves = [(lp[:6], mask[:6]), (lp[6:], mask[6:])]
    total = sum(rft.nll_loss(x, x.detach(), m, mask.sum().item())[0] for x, m in halves)
    assert torch.allclose(total, -(lp * mask).sum() / mask.sum())
    grad_nll, = torch.autograd.grad(total, logits, retain_graph=True)
    pg = sum(policy_loss(x, x.detach(), torch.ones_like(x), m, mask.sum().item())[0] for x, m in halves)
    grad_pg, = torch.autograd.grad(pg, logits)
    assert torch.allclose(grad_nll, grad_pg, atol=1e-6)              # on-policy, A = 1: the same direction
    loss, stats = rft.nll_loss(lp, lp.detach() + 0.1 * mask, mask, mask.sum().item(), reducer_world_size=3)
    assert torch.allclose(loss, -3 * (lp * mask).sum() / mask.sum())  # scaled for the reducer's average
    assert stats.loss_tokens == 8 and stats.clip_fraction == 0.0 and abs(stats.mismatch - 0.1) < 1e-6
    with pytest.raises(ValueError, match="global_loss_tokens"):
        rft.nll_loss(lp, lp, mask, 0)


@pytest.mark.slow
def test_an_rft_step_is_supervised_fine_tuning_on_the_steps_passed_episodes(warm_dir, tmp_path):
    """One step of `tbhpc train algorithm=rft` (local generator, the tiny warm start): every episode in
    the step's buffer passed its check, and the weights moved exactly as one AdamW step of plain
    token-mean NLL on those episodes moves them (Adam's first step: -lr x sign of the gradient)."""
    from transformers import AutoModelForCausalLM

    from helpers import checkpoint_weights
    from test_train_run import POOL, SMALL, _train
    from tbhpc.rollout.buffer import read_step
    import duckdb
    pool = tmp_path / "pool.yaml"
    pool.write_text(POOL)
    run = tmp_path / "run"
    lr = 1e-4
    res = _train(run, f"model={warm_dir}", f"pool={pool}", *[o for o in SMALL if not o.startswith("steps=")], "steps=1",
                 "algorithm=rft", "grad_clip=1e9", "zero_stage=0")
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    con = duckdb.connect(str(run / "results.duckdb"), read_only=True)
    kept, loss_tokens, clip = con.execute("SELECT kept, loss_tokens, clip_fraction FROM train_steps").fetchone()
    con.close()
    drawn = read_step(run / "buffers" / "step-000001.h5")       # every sample drawn; the trained ones carry 1
    episodes = [e for e in drawn if e.advantage == 1.0]
    assert kept >= 1 and episodes and all(e.reward == 1.0 for e in episodes), kept
    assert all(e.advantage == 0.0 for e in drawn if e.reward != 1.0) and len(episodes) == sum(e.reward == 1.0 for e in drawn)
    assert loss_tokens == sum(int(e.loss_mask[1:].sum()) for e in episodes) and clip == 0.0
    model = AutoModelForCausalLM.from_pretrained(warm_dir, dtype=torch.float32)
    nll = 0.0
    for e in episodes:
        ids = torch.tensor(e.tokens, dtype=torch.long)[None]
        lp = torch.log_softmax(model(ids).logits[0, :-1].float(), -1).gather(-1, ids[0, 1:, None])[:, 0]
        nll = nll - (lp * torch.tensor(e.loss_mask[1:], dtype=torch.float32)).sum()
    (nll / loss_tokens).backward()
    before, after = checkpoint_weights(Path(warm_dir)), checkpoint_weights(run / "exports" / "step-000001")
    checked = 0
    for name, p in model.named_parameters():
        if p.grad is None or name not in after:
            continue
        g, delta = p.grad.numpy(), after[name] - before[name]
        big = np.abs(g) > 1e-5                       # where Adam's eps does not shrink the step
        assert np.allclose(delta[big], -lr * np.sign(g[big]), rtol=0.02, atol=lr * 0.02), name
        checked += int(big.sum())
    assert checked > 1000
