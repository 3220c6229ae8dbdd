"""GRPO math as pure functions: group-centred advantages, informative groups, and the PPO-clip
policy loss aggregated as a token mean over the *global* batch.

Why pure functions: the loss is where a distributed trainer silently goes wrong. A per-rank mean
(or a per-sequence mean) weights a token by how many tokens happen to share its rank or its
episode, so the gradient changes with the number of ranks and with episode lengths. Here every
rank divides its token sum by the loss-token count of the whole step (all ranks, all
micro-batches), and by how many ranks the gradient reducer averages over, so the update is the
same on 1, 2 or 3 ranks. The recipe: advantage = reward - group mean (std normalisation a
switch, default off), ratio to the behaviour logprobs the server returned, clip low/high, no KL.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def group_advantages(rewards, groups, normalize_std: bool = False, eps: float = 1e-6) -> np.ndarray:
    """reward - mean reward of its group (÷ group std + eps when `normalize_std`), per episode."""
    r = np.asarray(rewards, dtype=np.float64)
    g = np.asarray(groups)
    if r.shape != g.shape or r.ndim != 1:
        raise ValueError(f"rewards {r.shape} and groups {g.shape} must be 1-D and equally long")
    out = np.empty_like(r)
    for gid in np.unique(g):
        sel = g == gid
        centred = r[sel] - r[sel].mean()
        out[sel] = centred / (r[sel].std() + eps) if normalize_std else centred
    return out.astype(np.float32)


def is_informative(rewards) -> bool:
    """A group whose rewards are not all equal: the only kind that carries a GRPO signal."""
    r = np.asarray(rewards, dtype=np.float64)
    return r.size > 1 and bool(np.ptp(r) > 0)


@dataclass
class LossStats:
    loss_tokens: int            # loss tokens in this call
    clip_fraction: float        # share of them whose ratio the clip held back
    mismatch: float             # mean |trainer logprob - behaviour logprob| (on-policy: the engines' disagreement)
    ratio_max: float


def policy_loss(logprobs, behaviour_logprobs, advantages, loss_mask, global_loss_tokens: float,
                clip_low: float = 0.2, clip_high: float = 0.2, reducer_world_size: int = 1, dual_clip: float = 0.0,
                token_weights=None):
    """PPO-clip loss of one micro-batch on one rank (torch tensors of one shape, [B, L] or [T]).

    `global_loss_tokens`: loss tokens of the whole step over every rank and micro-batch (the
    normaliser; with `token_weights` = 1 / the episode's loss tokens, pass the step's episode count
    instead: the loss is then the mean over episodes of each episode's token mean).
    `reducer_world_size`: ranks whose gradients the reducer *averages* (DeepSpeed and DDP do);
    the loss is scaled by it so that the averaged gradient is the global token mean.
    `dual_clip` (> 1, 0 = off): a negative-advantage token's loss is capped at -A x dual_clip, so
    one token whose ratio exploded cannot dominate the step (verl's clip_ratio_c, 3 in the recipe).
    Summing the returned losses over micro-batches and ranks gives the step's token-mean loss
    times `reducer_world_size`. Returns (loss, LossStats)."""
    import torch

    if global_loss_tokens <= 0:
        raise ValueError("global_loss_tokens must be positive (a step with no loss tokens has nothing to learn)")
    mask = loss_mask.to(logprobs.dtype)
    log_ratio = (logprobs - behaviour_logprobs) * mask
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    if dual_clip:
        per_token = torch.where(advantages < 0, torch.minimum(per_token, -advantages * dual_clip), per_token)
    weighted = per_token * mask if token_weights is None else per_token * mask * token_weights.to(per_token.dtype)
    loss = weighted.sum() * (reducer_world_size / global_loss_tokens)
    with torch.no_grad():
        n = int(mask.sum().item())
        held = ((clipped > unclipped) & (mask > 0)).sum().item()
        stats = LossStats(n, held / n if n else 0.0,
                          float((log_ratio.abs() * mask).sum().item() / n) if n else 0.0,
                          float((ratio * mask).max().item()) if n else 0.0)
    return loss, stats
