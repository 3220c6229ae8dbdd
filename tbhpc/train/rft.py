"""Rejection-sampling fine-tuning (RFT, expert iteration): the baseline that uses the same checks.

Why it is a training mode and not a script: a practitioner with executable checks but no
demonstrations asks whether GRPO is worth it over fine-tuning on their own successful rollouts.
The comparison is only fair when both run through the same trainer. So `algorithm: rft` differs
from GRPO in exactly three places, and shares everything else with it: the pool, the draw order,
the rollout path, the grading, DeepSpeed, checkpoints, exports, resume and syncs.
- which groups a step keeps: any group with at least one passed check (`keeps`). GRPO keeps the
  mixed ones. An all-pass group teaches RFT something; an all-fail group teaches neither.
- what is trained on: the episodes whose check passed, each token weighing 1 (`samples`);
- the loss: the negative log-likelihood of those tokens, as a token mean over the whole step
  (`nll_loss`). No ratio, no clip, no baseline: supervised learning on the policy's own successes.
"""
from __future__ import annotations

from tbhpc.train.grpo import LossStats

PASS = 1.0 - 1e-9          # a reward at or above this is a passed check (rewards are 0 or 1)


def passed(reward: float) -> bool:
    return reward >= PASS


def keeps(rollouts) -> bool:
    """A group RFT trains on: at least one episode whose check passed."""
    return any(passed(r.episode.reward) for r in rollouts)


def samples(kept, overlong_filter: bool = False, is_overlong=None) -> tuple[list, list[float], int]:
    """(samples, weights, episodes left out) of the kept groups: every sample of every passed
    episode with weight 1. With `overlong_filter`, a passed episode cut off by the response budget
    is left out, as GRPO leaves it out."""
    out, weights, left = [], [], 0
    for g in kept:
        for r in g.rollouts:
            if not passed(r.episode.reward):
                continue
            if overlong_filter and is_overlong(r.episode):
                left += 1
                continue
            for sample in r.samples:
                sample.advantage = 1.0
                out.append(sample)
                weights.append(1.0)
    return out, weights, left


def nll_loss(logprobs, behaviour_logprobs, loss_mask, global_loss_tokens: float, reducer_world_size: int = 1,
             token_weights=None):
    """-log pi of the loss tokens, summed and divided by the step's loss tokens over every rank and
    micro-batch (`global_loss_tokens`, as in grpo.policy_loss, whose normalisation it shares), times
    `reducer_world_size` for the reducer's average. The behaviour logprobs only feed the statistics
    (the engines' mismatch). Returns (loss, LossStats)."""
    import torch

    if global_loss_tokens <= 0:
        raise ValueError("global_loss_tokens must be positive (a step with no loss tokens has nothing to learn)")
    mask = loss_mask.to(logprobs.dtype)
    per_token = -logprobs * mask
    if token_weights is not None:
        per_token = per_token * token_weights.to(per_token.dtype)
    loss = per_token.sum() * (reducer_world_size / global_loss_tokens)
    with torch.no_grad():
        n = int(mask.sum().item())
        log_ratio = (logprobs - behaviour_logprobs) * mask
        stats = LossStats(n, 0.0, float(log_ratio.abs().sum().item() / n) if n else 0.0,
                          float((torch.exp(log_ratio) * mask).max().item()) if n else 0.0)
    return loss, stats
