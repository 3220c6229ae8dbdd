"""GRPO against continued SFT, both started from the same SFT plateau and given the same wall time:
the comparison the demo exists to show, paired over tasks, on the held-out split and on fresh
instances, overall and per task type.

Why its own table: Table 1 asks "did training help?" (start vs trained); a user choosing a recipe
asks "was RL worth it over more SFT?". The answer reads off the same DuckDB files, paired the same
way (metrics.agg.compare: a bootstrap over shared tasks), with the SFT run as the base so every Δ
is GRPO - SFT. pass^k is at k = the repeats: a task counts only when all k attempts pass
(observed k/k). The markdown is a pure function of the summaries (golden-testable).
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from tbhpc.metrics import render


@dataclass
class Side:
    """One split's three runs (summaries from metrics.agg.summarise) and GRPO - SFT (agg.compare)."""
    label: str
    k: int
    start: dict
    sft: dict
    grpo: dict
    grpo_minus_sft: dict


def _delta(cmp: dict, name: str) -> str:
    d = cmp["metrics"].get(name)
    return "-" if d is None else f"{100 * d['delta']:+.1f} [{100 * d['lo']:+.1f}, {100 * d['hi']:+.1f}]"


def _kk(s: dict) -> str:
    return f"{s['k/k']['count']}/{s['tasks']}"


def comparison_markdown(sides: list[Side]) -> str:
    """One row per metric and split: start, SFT, GRPO, and GRPO - SFT with its paired 95% interval."""
    lines = ["| split | metric | start | continued SFT | GRPO | GRPO - SFT, pts [paired 95%] |",
             "|---|---|---|---|---|---|"]
    for s in sides:
        k = s.k
        rows = [("pass@1", lambda x: render.ci(x["pass@1"]), "pass@1"),
                (f"pass^{k} (all {k} of {k})", lambda x: f"{render.ci(x['k/k'])} ({_kk(x)})", "k/k")]
        if k in s.start["pass@k"]:
            rows.append((f"pass@{k}", lambda x: render.ci(x["pass@k"][k]), f"pass@{k}"))
        for name, cell, key in rows:
            lines.append(f"| {s.label} | {name} | {cell(s.start)} | {cell(s.sft)} | {cell(s.grpo)} | "
                         f"{_delta(s.grpo_minus_sft, key)} |")
    return "\n".join(lines)


def template_rates(counts, template_of: dict[str, str]) -> dict[str, tuple[float, int, int]]:
    """template -> (pass@1, tasks at k/k, tasks) from one run's per-task counts."""
    acc: dict[str, list] = defaultdict(lambda: [0, 0, 0, 0])
    for tid, n, c in zip(counts.task_ids.tolist(), counts.n, counts.c):
        if n > 0:
            a = acc[template_of[tid]]
            a[0] += int(c)
            a[1] += int(n)
            a[2] += int(c == n)
            a[3] += 1
    return {t: (a[0] / a[1], a[2], a[3]) for t, a in acc.items()}


def template_markdown(start: dict, sft: dict, grpo: dict, k: int) -> str:
    """Per task type: pass@1 and tasks at k/k of the three runs (outputs of template_rates)."""
    lines = [f"| task type | tasks | start pass@1 | SFT pass@1 | GRPO pass@1 | GRPO - SFT | {k}/{k}: start / SFT / GRPO |",
             "|---|---|---|---|---|---|---|"]
    for t in sorted(start):
        if t in sft and t in grpo:
            (p0, k0, n), (p1, k1, _), (p2, k2, _) = start[t], sft[t], grpo[t]
            lines.append(f"| {t} | {n} | {p0:.2f} | {p1:.2f} | {p2:.2f} | {p2 - p1:+.2f} | {k0} / {k1} / {k2} |")
    return "\n".join(lines)


def verdict(sides: list[Side]) -> str:
    """The issue's goal in one line: GRPO - SFT on pass^k above 0 (interval), pass@1 not below."""
    parts = []
    for s in sides:
        kk, p1 = s.grpo_minus_sft["metrics"]["k/k"], s.grpo_minus_sft["metrics"]["pass@1"]
        word = ("above SFT" if kk["lo"] > 0 else "below SFT" if kk["hi"] < 0 else "not separable from SFT")
        parts.append(f"{s.label}: GRPO's pass^{s.k} is {word} ({100 * kk['delta']:+.1f} pts), "
                     f"pass@1 {100 * p1['delta']:+.1f} pts [{100 * p1['lo']:+.1f}, {100 * p1['hi']:+.1f}]")
    return "; ".join(parts)


def as_summary(sides: list[Side]) -> dict:
    """What demo.json keeps: per split, each metric's three values and GRPO - SFT with its interval."""
    out = {}
    for s in sides:
        m = s.grpo_minus_sft["metrics"]
        keys = ["pass@1", "k/k"] + ([f"pass@{s.k}"] if f"pass@{s.k}" in m else [])
        out[s.label] = {key: {"grpo_minus_sft": m[key]} for key in keys}
        for key in keys:
            for name, summ in (("start", s.start), ("sft", s.sft), ("grpo", s.grpo)):
                v = summ["pass@1"] if key == "pass@1" else summ["k/k"] if key == "k/k" else summ["pass@k"][s.k]
                out[s.label][key][name] = float(np.round(v["value"], 6))
    return out
