"""GRPO math alone (tbhpc/train/grpo.py): advantages, informative groups, the clipped loss and
its token-mean over the global batch. The rank split here is arithmetic (gradients averaged by
hand, as DeepSpeed's reducer does); the same invariance across real gloo processes belongs to the
trainer's tests."""
import numpy as np
import pytest
import torch

from tbhpc.train.grpo import group_advantages, is_informative, policy_loss


def test_advantage_is_reward_minus_group_mean_with_optional_std():
    adv = group_advantages([1, 0, 0, 1, 1, 0], [0, 0, 0, 1, 1, 2])
    np.testing.assert_allclose(adv, [2 / 3, -1 / 3, -1 / 3, 0, 0, 0], atol=1e-6)
    std = group_advantages([1, 0, 0, 0], [5, 5, 5, 5], normalize_std=True)
    np.testing.assert_allclose(std, np.array([0.75, -0.25, -0.25, -0.25]) / np.std([1, 0, 0, 0]), rtol=1e-4)
    assert group_advantages([1, 1], [0, 0], normalize_std=True).tolist() == [0.0, 0.0]   # no signal, no NaN
    with pytest.raises(ValueError, match="equally long"):
        group_advantages([1, 0], [0])


def test_only_mixed_groups_are_informative():
    assert is_informative([1, 0, 0, 0]) and is_informative([0.5, 0.25])
    assert not is_informative([1, 1, 1]) and not is_informative([0, 0]) and not is_informative([1])


def _leaf(x):
    return torch.tensor(x, dtype=torch.float64, requires_grad=True)


def test_on_policy_loss_is_the_token_mean_of_minus_advantage():
    lp = _leaf([[-1.0, -2.0, -0.5], [-0.3, -0.7, 0.0]])
    mask = torch.tensor([[0, 1, 1], [1, 1, 0]])
    adv = torch.tensor([[0.5, 0.5, 0.5], [-1.0, -1.0, -1.0]], dtype=torch.float64)
    loss, st = policy_loss(lp, lp.detach(), adv, mask, global_loss_tokens=4)
    assert loss.item() == pytest.approx(-(0.5 + 0.5 - 1.0 - 1.0) / 4)
    loss.backward()
    np.testing.assert_allclose(lp.grad.numpy(), (-adv * mask / 4).numpy())        # padding and prompts: no gradient
    assert (st.loss_tokens, st.clip_fraction, st.mismatch, st.ratio_max) == (4, 0.0, 0.0, 1.0)


def test_clipping_stops_the_gradient_outside_the_trust_region():
    old = torch.zeros(4, dtype=torch.float64)
    lp = _leaf(np.log([1.5, 0.5, 1.5, 0.5]))          # ratios 1.5, 0.5, 1.5, 0.5
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0], dtype=torch.float64)
    loss, st = policy_loss(lp, old, adv, torch.ones(4), global_loss_tokens=4, clip_low=0.2, clip_high=0.28)
    loss.backward()
    # positive advantage above 1 + clip_high, negative below 1 - clip_low: held; the other two move
    assert lp.grad[0].item() == 0 and lp.grad[3].item() == 0 and lp.grad[1].item() < 0 and lp.grad[2].item() > 0
    assert st.clip_fraction == 0.5 and st.ratio_max == pytest.approx(1.5)
    assert st.mismatch == pytest.approx(np.mean(np.abs(np.log([1.5, 0.5, 1.5, 0.5]))))


@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_same_gradient_whatever_the_rank_split(ranks):
    """Episodes of very different lengths, split unevenly over 1-3 ranks and 1-2 micro-batches
    per rank: the averaged gradient equals the single-batch token mean."""
    rng = np.random.default_rng(0)
    lengths = [3, 40, 7, 120, 15, 9, 64, 2]
    eps = [(rng.normal(size=n) - 1.0, rng.normal(size=n) - 1.0, rng.integers(0, 2, n), rng.normal()) for n in lengths]
    total = int(sum(m.sum() for _, _, m, _ in eps))

    def grads(part, world):
        lp = _leaf(np.concatenate([e[0] for e in part]))
        old = torch.tensor(np.concatenate([e[1] for e in part]))
        mask = torch.tensor(np.concatenate([e[2] for e in part]))
        adv = torch.tensor(np.concatenate([np.full(len(e[0]), e[3]) for e in part]))
        loss, _ = policy_loss(lp, old, adv, mask, global_loss_tokens=total, clip_low=0.2, clip_high=0.28,
                              reducer_world_size=world)
        loss.backward()
        return lp.grad.numpy()

    reference = grads(eps, 1)
    cuts = np.array_split(np.arange(len(eps)), ranks)
    per_rank = []
    for idx in cuts:        # each rank: its episodes, in up to two micro-batches (gradients accumulate)
        mbs = np.array_split(idx, 2) if len(idx) > 1 else [idx]
        per_rank.append(np.concatenate([grads([eps[i] for i in mb], ranks) for mb in mbs if len(mb)]))
    averaged = np.concatenate([g / ranks for g in per_rank])       # what an averaging all-reduce leaves per token
    np.testing.assert_allclose(averaged, reference, rtol=1e-12, atol=1e-15)
    with pytest.raises(ValueError, match="global_loss_tokens must be positive"):
        policy_loss(_leaf([0.0]), torch.zeros(1), torch.ones(1), torch.zeros(1), global_loss_tokens=0)


def test_seq_mean_weighs_every_episode_alike_and_sums_to_zero_on_policy():
    """seq-mean-token-mean: each episode's tokens weigh 1 / its loss tokens and the normaliser is the
    episode count, so the loss is the mean of per-episode token means. On policy with group-centred
    advantages it is exactly 0 whatever the lengths, while token-mean leans on the long episodes
    (here the long one failed: the token mean pushes the sampled tokens' logprobs down overall)."""
    from tbhpc.rollout.buffer import Episode
    from tbhpc.train.packing import pack
    long_fail = Episode(np.arange(41), np.r_[np.zeros(1), np.ones(40)], np.zeros(41), group=0, reward=0.0, task_id="t")
    short_pass = Episode(np.arange(11), np.r_[np.zeros(1), np.ones(10)], np.zeros(11), group=0, reward=1.0, task_id="t")
    adv = [-0.5, 0.5]
    p, = pack([long_fail, short_pass], adv, budget=64, seq_weights=True)
    np.testing.assert_allclose(p.weights.numpy()[:40], 1 / 40) and np.testing.assert_allclose(p.weights.numpy()[-10:], 1 / 10)
    lp = torch.zeros(p.input_ids.shape[1] - 1, dtype=torch.float64, requires_grad=True)
    seq, _ = policy_loss(lp, lp.detach(), p.advantages.double(), p.loss_mask, 2, token_weights=p.weights)
    tok, _ = policy_loss(lp, lp.detach(), p.advantages.double(), p.loss_mask, p.n_loss_tokens)
    assert seq.item() == pytest.approx(0.0, abs=1e-12)
    assert tok.item() == pytest.approx((0.5 * 40 - 0.5 * 10) / 50)      # > 0: minimising it lowers the sampled logprobs
    assert pack([long_fail, short_pass], adv, budget=64)[0].weights is None


@pytest.mark.parametrize("tis_cap", [0.0, 2.0])
def test_the_importance_weighted_loss_is_the_on_policy_loss_when_behaviour_is_current(tis_cap):
    """max_staleness 1 trains on samples of older weights through the ratio to their behaviour
    logprobs (and, with tis_cap, the decoupled loss): when the behaviour policy is the current one,
    both give exactly the on-policy loss and gradient, -A x grad log pi / tokens."""
    rng = np.random.default_rng(1)
    lp = _leaf(-rng.random((2, 5)) * 3)
    mask = torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    adv = torch.tensor(rng.normal(size=(2, 1)), dtype=torch.float64).expand(2, 5)
    loss, st = policy_loss(lp, lp.detach(), adv, mask, global_loss_tokens=7, tis_cap=tis_cap)
    loss.backward()
    assert loss.item() == pytest.approx(float((-adv * mask).sum() / 7))
    np.testing.assert_allclose(lp.grad.numpy(), (-adv * mask / 7).numpy(), rtol=1e-12)
    assert (st.clip_fraction, st.truncated, st.ratio_max) == (0.0, 0.0, 1.0)


def test_truncated_is_weights_tokens_by_pi_over_mu_capped_and_without_gradient_through_the_weight():
    """tis_cap C: a token's gradient is -A x min(pi/mu, C) x grad log pi / tokens (the weight is a
    constant; the PPO clip, measured from the weights being updated, is inert in one update); the
    default loss clips the same tokens by pi/mu instead (no gradient beyond 1 + clip_high for A > 0)."""
    mu = torch.zeros(5, dtype=torch.float64)
    ratios = np.array([0.25, 0.9, 1.5, 2.0, 4.0])          # pi/mu of each token
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0, 1.0], dtype=torch.float64)
    lp = _leaf(np.log(ratios))
    loss, st = policy_loss(lp, mu, adv, torch.ones(5), global_loss_tokens=5, tis_cap=2.0, dual_clip=3.0)
    loss.backward()
    weight = np.minimum(ratios, 2.0)
    np.testing.assert_allclose(lp.grad.numpy(), -adv.numpy() * weight / 5, rtol=1e-12)
    assert loss.item() == pytest.approx(float((-adv.numpy() * weight).sum() / 5))
    assert st.truncated == pytest.approx(1 / 5)             # only 4.0 is above the cap (2.0 is at it)
    assert st.ratio_max == pytest.approx(4.0) and st.clip_fraction == 0.0
    plain = _leaf(np.log(ratios))
    loss, st = policy_loss(plain, mu, adv, torch.ones(5), global_loss_tokens=5, clip_low=0.2, clip_high=0.2)
    loss.backward()
    # default: d/dlp of -A x ratio where unclipped; A > 0 above 1.2 is held (tokens 2 and 4)
    np.testing.assert_allclose(plain.grad.numpy(), [-0.25 / 5, 0.9 / 5, 0.0, 2.0 / 5, 0.0], rtol=1e-12)
    assert st.truncated == 0.0
