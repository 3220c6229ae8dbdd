"""PNG plots of a campaign (and optionally a second one to compare). Agg backend: no display."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from tbhpc.metrics.agg import Counts  # noqa: E402
from tbhpc.metrics.stats import pass_at_k, pass_hat_k  # noqa: E402


def _clean(c: Counts) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    keep = c.n > 0
    return c.n[keep], c.c[keep], c.domains[keep]


def domain_bars(runs: list[tuple[str, Counts]], path: Path) -> Path:
    domains = sorted({d for _, c in runs for d in _clean(c)[2].tolist()})
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    width = 0.8 / len(runs)
    x = np.arange(len(domains))
    for j, (label, counts) in enumerate(runs):
        n, c, dom = _clean(counts)
        p1 = [c[dom == d].sum() / max(n[dom == d].sum(), 1) for d in domains]
        kk = [((c == n) & (dom == d)).sum() / max((dom == d).sum(), 1) for d in domains]
        axes[0].bar(x + j * width, p1, width, label=label)
        axes[1].bar(x + j * width, kk, width, label=label)
    for ax, title in zip(axes, ("pass@1 by domain", "share of tasks at k/k by domain")):
        ax.set_xticks(x + width * (len(runs) - 1) / 2, domains, rotation=20)
        ax.set_ylim(0, 1)
        ax.set_title(title)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    return _save(fig, path)


def k_curves(runs: list[tuple[str, Counts]], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for j, (label, counts) in enumerate(runs):
        n, c, _ = _clean(counts)
        ks = np.arange(1, int(n.min()) + 1)
        colour = f"C{j}"
        ax.plot(ks, [pass_at_k(n, c, k).mean() for k in ks], color=colour, marker="o", ms=3, label=f"pass@k {label}")
        ax.plot(ks, [pass_hat_k(n, c, k).mean() for k in ks], color=colour, marker="s", ms=3, ls="--", label=f"pass^k {label}")
    ax.set_xlabel("k")
    ax.set_ylim(0, 1.02)
    ax.set_title("pass@k and pass^k (unbiased) against k")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def rate_histogram(runs: list[tuple[str, Counts]], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6.5, 4))
    bins = np.linspace(0, 1, 21)
    for label, counts in runs:
        n, c, _ = _clean(counts)
        ax.hist(c / n, bins=bins, alpha=0.6, label=label)
    ax.set_xlabel("per-task success rate c/n")
    ax.set_ylabel("tasks")
    ax.set_title("distribution of per-task success rates")
    ax.legend(fontsize=8)
    return _save(fig, path)


def band_bars(band_counts: dict[str, int], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(6.5, 3.5))
    names = list(band_counts)
    ax.bar(names, [band_counts[b] for b in names], color=["#999", "#c44", "#d93", "#4a4", "#999"][: len(names)])
    ax.set_title("probe: tasks per difficulty band (Jeffreys argmax)")
    ax.set_ylabel("tasks")
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def train_curves(steps: list[dict], path: Path) -> Path:
    """Per-step training scalars: reward and mixed share, loss and grad norm, clip and logprob
    mismatch, where the step's time went, and (runs recorded with them) response length and
    entropy, the collapse guard's trips marked."""
    x = [r["step"] for r in steps]
    health = any(r.get("gen_tokens") is not None for r in steps)
    fig, axes = plt.subplots(3 if health else 2, 2, figsize=(10, 9.5 if health else 6.5))
    ax = axes[0][0]
    ax.plot(x, [r["reward_mean"] for r in steps], marker="o", label="reward (all drawn episodes)")
    ax.plot(x, [r["mixed_share"] for r in steps], marker=".", ls="--", label="mixed-group share")
    ax.set_title("reward")
    ax.legend(fontsize=8)
    ax = axes[0][1]
    ax.plot(x, [r["loss"] for r in steps], marker="o", label="loss")
    ax2 = ax.twinx()
    ax2.plot(x, [r["grad_norm"] for r in steps], marker=".", color="#c44", label="grad norm")
    ax.set_title("loss (left) and grad norm (right)")
    ax = axes[1][0]
    ax.plot(x, [r["clip_fraction"] for r in steps], marker="o", label="clip fraction")
    ax.plot(x, [r["mismatch"] for r in steps], marker=".", label="|trainer - server| logprob")
    ax.set_yscale("symlog", linthresh=1e-6)
    ax.set_title("clipping and logprob mismatch")
    ax.legend(fontsize=8)
    ax = axes[1][1]
    bottom = np.zeros(len(x))
    for key, color in (("rollout_s", "#4a4"), ("update_s", "#36c"), ("publish_s", "#d93"), ("sync_s", "#999")):
        vals = np.array([r[key] for r in steps], dtype=float)
        ax.bar(x, vals, bottom=bottom, color=color, label=key.removesuffix("_s"))
        bottom += vals
    ax.set_title("step time (s)")
    ax.legend(fontsize=8)
    if health:
        _health_axes(axes[2], steps)
    from matplotlib.ticker import MaxNLocator
    for a in axes.flat:
        a.set_xlabel("step")
        a.xaxis.set_major_locator(MaxNLocator(integer=True))
    return _save(fig, path)


def _health_axes(axes, steps: list[dict]) -> None:
    """Response length (mean generated tokens per episode, share cut off by the budget) and entropy
    (mean surprisal of the sampled tokens); a vertical line where the collapse guard tripped."""
    rows = [r for r in steps if r.get("gen_tokens") is not None]
    x = [r["step"] for r in rows]
    ax = axes[0]
    ax.plot(x, [r["gen_tokens"] for r in rows], color="#36c", label="generated tokens per episode")
    ax.set_title("response length (left), share cut off by the budget (right)")
    ax2 = ax.twinx()
    ax2.plot(x, [r.get("overlong") or 0.0 for r in rows], color="#c44", ls="--", label="overlong share")
    ax2.set_ylim(0, 1)
    ax = axes[1]
    ax.plot(x, [r["entropy"] for r in rows], color="#4a4", label="entropy (nats per generated token)")
    ax.set_title("entropy")
    for a in axes:
        for r in rows:
            if r.get("guard"):
                a.axvline(r["step"], color="#d93", lw=1, label=f"guard: {r['guard']}")
        handles, labels = a.get_legend_handles_labels()
        seen = dict(zip(labels, handles))
        a.legend(seen.values(), seen.keys(), fontsize=8)


def train_timeline(steps: list[dict], path: Path) -> Path | None:
    """When each step's rollouts, update and publish ran (wall clock, rank 0): on-policy the lanes
    alternate, one step off-policy step N+1's rollouts sit under step N's update. None for runs
    recorded before the timestamps existed."""
    from datetime import datetime
    rows = [r for r in steps if r.get("rollout_start") and r.get("update_end")]
    if not rows:
        return None

    def t(v) -> float:
        return datetime.fromisoformat(str(v)).timestamp()
    t0 = min(t(r["rollout_start"]) for r in rows)
    fig, ax = plt.subplots(figsize=(10, 2.8))
    lanes = (("rollouts (server)", "rollout_start", "rollout_end", "#4a4", 2),
             ("update (trainer)", "update_start", "update_end", "#36c", 1),
             ("publish", "update_end", "published", "#d93", 0))
    for label, a, b, color, y in lanes:
        spans = [(t(r[a]) - t0, t(r[b]) - t(r[a])) for r in rows if r.get(a) and r.get(b)]
        ax.broken_barh(spans, (y - 0.35, 0.7), color=color, edgecolor="white")
        for r, (x, w) in zip(rows, spans):
            if y and w > 0:
                ax.text(x + w / 2, y, str(r["step"]), ha="center", va="center", fontsize=7, color="white")
    ax.set_yticks([2, 1, 0], [lane[0] for lane in lanes])
    ax.set_xlabel("seconds since the first rollouts began")
    off = any(r.get("max_staleness") for r in rows)
    ax.set_title(f"step timeline ({'one step off-policy' if off else 'on-policy'})")
    return _save(fig, path)
