"""How much signal does one GRPO step carry? Per-group policy gradients from a run's buffers.

Why: a GRPO step's gradient is the sum of its groups' gradients, and each group's is mostly
sampling noise (every sampled token's score function, weighted by the group-centred advantage).
If the step has too few groups, the update is a random walk: with Adam every parameter moves by
about lr whatever the gradient's size, so noise costs as much as signal. When a step has far
fewer groups than signal = noise needs, no learning rate makes it learn (small ones stay put,
large ones degrade the policy; docs/measurements/demo-history.md, "What GRPO did to the demo
model"). Measure this before buying GPU hours: `tbhpc grad-noise RUN` on a few steps of any run.

The statistics (pure, `noise_of`): per-group gradients g_i (i = 1..n, informative groups only),
their mean m and the unbiased per-group variance V; the squared norm of the expected gradient
S = |m|^2 - V/n (unbiased); groups per step for signal = noise: V / S; the expected cosine
between two independent steps of B groups: S / (S + V/B) (0: the steps agree no more than chance).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tbhpc.errors import UserError


@dataclass
class GradientNoise:
    groups: int                 # informative groups measured
    signal: float               # |E g|^2 estimate (per-group gradient units; < 0: not detected)
    noise: float                # E |g - E g|^2 per group
    split_cos: float            # cosine between the summed gradients of two random halves (measured)

    @property
    def groups_for_snr1(self) -> float:
        """Groups per step whose summed gradient has as much signal as noise (inf: none detected)."""
        return self.noise / self.signal if self.signal > 0 else float("inf")

    def step_cos(self, groups_per_step: int) -> float:
        """Expected cosine between the gradients of two independent steps of this many groups."""
        return self.signal / (self.signal + self.noise / groups_per_step) if self.signal > 0 else 0.0


def noise_of(grads: np.ndarray, seed: int = 0, splits: int = 64) -> GradientNoise:
    """`grads` [n_groups, n_params]: one row per informative group (any common scale)."""
    g = np.asarray(grads, dtype=np.float64)
    n = len(g)
    if g.ndim != 2 or n < 2:
        raise ValueError(f"need at least 2 group gradients as rows of a 2-D array, got shape {g.shape}")
    mean = g.mean(0)
    noise = float(((g - mean) ** 2).sum(1).sum() / (n - 1))
    signal = float(mean @ mean - noise / n)
    rng = np.random.default_rng(seed)
    cos = []
    for _ in range(splits):
        p = rng.permutation(n)
        a, b = g[p[: n // 2]].sum(0), g[p[n // 2: 2 * (n // 2)]].sum(0)
        denom = np.linalg.norm(a) * np.linalg.norm(b)
        cos.append(float(a @ b / denom) if denom > 0 else 0.0)
    return GradientNoise(n, signal, noise, float(np.mean(cos)))


# Which generated tokens a gradient is taken over (`grad-noise --tokens`): where is the signal?
TOKEN_CLASSES = {
    "all": "every generated token (what the trainer steps on)",
    "choices": "tokens sampled with probability < 0.9 (the policy's real choices)",
    "confident": "tokens sampled with probability >= 0.9",
    "tool-calls": "tokens inside <tool_call> ... </tool_call>",
    "text": "generated tokens outside tool calls",
}


def token_mask(e, cls: str, call_open: int | None = None, call_close: int | None = None) -> np.ndarray:
    """The loss tokens of episode `e` in token class `cls` (TOKEN_CLASSES) as a bool array."""
    mask = np.asarray(e.loss_mask, bool)
    if cls == "all":
        return mask
    if cls in ("choices", "confident"):
        sure = np.exp(np.asarray(e.logprobs, np.float64)) >= 0.9
        return mask & (sure if cls == "confident" else ~sure)
    if cls in ("tool-calls", "text"):
        if call_open is None or call_close is None:
            raise UserError("grad-noise: the tokenizer has no <tool_call> and </tool_call> tokens")
        tokens = np.asarray(e.tokens)
        depth = np.cumsum(tokens == call_open) - np.cumsum(np.concatenate([[False], tokens[:-1] == call_close]))
        inside = depth > 0                  # from <tool_call> through </tool_call>
        return mask & (inside if cls == "tool-calls" else ~inside)
    raise UserError(f"grad-noise: --tokens must be one of {', '.join(TOKEN_CLASSES)}, got {cls!r}")


def group_gradients(model, groups: list[list], temperature: float = 1.0, mask_of=None) -> np.ndarray:
    """One flattened gradient of -sum_episodes A * sum_loss_tokens log pi per group, at `model`
    (ratio 1: the on-policy GRPO gradient of that group, unnormalised). `temperature` != 1: of
    the tempered policy softmax(logits / T) instead (the trainer steps on T = 1 today).
    `mask_of(episode)`: the tokens to take it over (default: the loss mask; see token_mask)."""
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    rows = []
    for episodes in groups:
        model.zero_grad(set_to_none=True)
        for e in episodes:
            ids = torch.from_numpy(e.tokens.astype(np.int64))[None]
            logp = torch.log_softmax(model(input_ids=ids, use_cache=False).logits[0, :-1].float() / temperature, -1)
            logp = logp.gather(1, ids[0, 1:, None])[:, 0]
            mask = torch.from_numpy(np.asarray(mask_of(e) if mask_of else e.loss_mask)[1:].astype(np.float32))
            (-float(e.advantage) * (logp * mask).sum()).backward()
        rows.append(torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in params]).numpy().copy())
    return np.stack(rows)


def informative_groups(buffers: Path, steps: list[int]) -> list[list]:
    """The groups with any nonzero advantage in the given steps' buffer files (every rank's)."""
    from tbhpc.rollout.buffer import read_step
    out = []
    for step in steps:
        files = sorted(Path(buffers).glob(f"step-{step:06d}*.h5"))
        if not files:
            raise UserError(f"grad-noise: no buffer file for step {step} in {buffers}")
        by_group: dict[int, list] = {}
        for f in files:
            for e in read_step(f):
                by_group.setdefault(e.group, []).append(e)
        out += [eps for _, eps in sorted(by_group.items()) if any(e.advantage != 0 for e in eps)]
    return out


def report(noise: GradientNoise, groups_per_step: int, where: str) -> str:
    """Plain text for the terminal (pure, so it is golden-testable)."""
    need = noise.groups_for_snr1
    lines = [f"gradient noise of {where}: {noise.groups} informative groups",
             f"  signal |E g|^2 {noise.signal:.4g}   noise per group {noise.noise:.4g}",
             f"  groups per step for signal = noise: {'not detected (more groups needed to see any)' if need == float('inf') else f'{need:.0f}'}",
             f"  cosine of two independent steps of {groups_per_step} groups: expected {noise.step_cos(groups_per_step):.3f}; "
             f"two halves of these groups: {noise.split_cos:.3f}"]
    if need != float("inf") and need > 4 * groups_per_step:
        lines.append(f"  -> a step of {groups_per_step} groups is mostly noise: Adam moves every weight by ~lr "
                     f"either way; use more groups per step (or accumulate steps) before a larger lr")
    return "\n".join(lines)
