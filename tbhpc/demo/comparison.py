"""GRPO against its start and against the baselines that had the same start and the same wall
time: the comparison the demo exists to show, paired over tasks, on the held-out split and on
fresh instances, overall and per task type.

Why its own table: Table 1 asks "did training help?" (start vs GRPO); a user choosing a recipe
asks "was RL worth it over fine-tuning on my own successes (RFT), which uses the same checks?",
and, if they have demonstrations, "over more SFT?". The answers read off the same DuckDB files,
paired the same way (metrics.agg.compare: a bootstrap over shared tasks). pass^k is at k = the
repeats: a task counts only when all k attempts pass (observed k/k). The markdown is a pure
function of the summaries (golden-testable).
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from tbhpc.metrics import render

# the runs a demo may evaluate (eval-<key>, fresh-<key>), in column order, and their names
LABELS = {"warm": "start", "trained": "GRPO", "rft": "RFT", "sft": "oracle SFT"}
# the paired differences reported, (a, b) meaning b - a, when both runs exist
PAIRS = (("warm", "trained"), ("warm", "rft"), ("rft", "trained"), ("sft", "trained"))
FOOTNOTE = ("RFT: fine-tuning on the policy's own passed episodes (the same checks, nothing more). "
            "oracle SFT: fine-tuning on oracle demonstrations of the pool's tasks, which needs demonstrations "
            "the checks do not give you.")


@dataclass
class Side:
    """One split's runs (summaries from metrics.agg.summarise, keyed as LABELS) and their paired
    differences (agg.compare(a, b), keyed (a, b) as PAIRS)."""
    label: str
    k: int
    runs: dict[str, dict]
    pairs: dict[tuple[str, str], dict]
    start_label: str = "start"

    def name(self, key: str) -> str:
        return self.start_label if key == "warm" else LABELS[key]

    def pair_name(self, pair: tuple[str, str]) -> str:
        return f"{self.name(pair[1])} - {self.name(pair[0])}"


def _delta(cmp: dict, name: str) -> str:
    d = cmp["metrics"].get(name)
    return "-" if d is None else f"{100 * d['delta']:+.1f} [{100 * d['lo']:+.1f}, {100 * d['hi']:+.1f}]"


def _kk(s: dict) -> str:
    return f"{s['k/k']['count']}/{s['tasks']}"


def metric_rows(k: int, with_pass_at_k: bool) -> list[tuple[str, object, str]]:
    """(row name, cell renderer, metric key of agg.compare)."""
    rows = [("pass@1", lambda x: render.ci(x["pass@1"]), "pass@1"),
            (f"pass^{k} (all {k} of {k})", lambda x: f"{render.ci(x['k/k'])} ({_kk(x)})", "k/k")]
    if with_pass_at_k:
        rows.append((f"pass@{k}", lambda x: render.ci(x["pass@k"][k]), f"pass@{k}"))
    return rows


def comparison_markdown(sides: list[Side]) -> str:
    """Per split: the metrics of every run, then each paired difference with its 95% interval, in pts."""
    out = []
    for s in sides:
        keys, pairs = list(s.runs), list(s.pairs)
        out += [f"{s.label} ({s.runs[keys[0]]['tasks']} tasks x {s.k}):", "",
                "| metric | " + " | ".join(s.name(key) for key in keys) + " | "
                + " | ".join(f"{s.pair_name(p)}, pts" for p in pairs) + " |",
                "|---" * (1 + len(keys) + len(pairs)) + "|"]
        for name, cell, metric in metric_rows(s.k, s.k > 1 and s.k in s.runs[keys[0]]["pass@k"]):
            out.append(f"| {name} | " + " | ".join(cell(s.runs[key]) for key in keys) + " | "
                       + " | ".join(_delta(s.pairs[p], metric) for p in pairs) + " |")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


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


def template_markdown(rates: dict[str, dict], k: int, names: dict[str, str] | None = None) -> str:
    """Per task type: pass@1 and tasks at k/k of each run (rates: run key -> template_rates), and
    GRPO minus each other run on pass@1."""
    names = names or LABELS
    keys = list(rates)
    others = [key for key in keys if key != "trained"]
    lines = ["| task type | tasks | " + " | ".join(f"{names[key]} pass@1" for key in keys) + " | "
             + " | ".join(f"GRPO - {names[key]}" for key in others) + f" | {k}/{k}: " + " / ".join(names[key] for key in keys)
             + " |", "|---" * (3 + len(keys) + len(others)) + "|"]
    first = rates[keys[0]]
    for t in sorted(first):
        if all(t in rates[key] for key in keys):
            p = {key: rates[key][t][0] for key in keys}
            lines.append(f"| {t} | {first[t][2]} | " + " | ".join(f"{p[key]:.2f}" for key in keys) + " | "
                         + " | ".join(f"{p['trained'] - p[key]:+.2f}" for key in others) + " | "
                         + " / ".join(str(rates[key][t][1]) for key in keys) + " |")
    return "\n".join(lines)


def verdict(sides: list[Side]) -> str:
    """The demo's goal, per split: GRPO above its start on pass@1 and on pass^k (intervals above 0),
    pass@k within 2 pts of the start (sharpening, not collapse), and GRPO - RFT >= 0 on pass^k."""
    parts = []
    for s in sides:
        words = []
        up = s.pairs.get(("warm", "trained"))
        if up is not None:
            m = up["metrics"]
            for key, name in (("pass@1", "pass@1"), ("k/k", f"pass^{s.k}")):
                d = m[key]
                where = "above" if d["lo"] > 0 else "below" if d["hi"] < 0 else "not separable from"
                words.append(f"GRPO's {name} is {where} the {s.start_label} ({100 * d['delta']:+.1f} pts)")
            pk = m.get(f"pass@{s.k}") if s.k > 1 else None
            if pk is not None:
                words.append(f"pass@{s.k} {100 * pk['delta']:+.1f} pts ({'within' if abs(pk['delta']) <= 0.02 else 'not within'}"
                             f" 2 pts)")
        for other in ("rft", "sft"):
            vs = s.pairs.get((other, "trained"))
            if vs is not None:
                d = vs["metrics"]["k/k"]
                sign = ">= 0" if d["delta"] >= 0 else "< 0"
                sep = " (interval above 0)" if d["lo"] > 0 else " (interval below 0)" if d["hi"] < 0 else ""
                words.append(f"GRPO - {LABELS[other]} on pass^{s.k} {100 * d['delta']:+.1f} pts, {sign}{sep}")
        parts.append(f"- {s.label}: " + "; ".join(words) + ".")
    return "\n".join(parts)


def as_summary(sides: list[Side]) -> dict:
    """What demo.json keeps: per split and metric, each run's value and each paired difference
    (keyed "GRPO - start" etc.) with its interval."""
    out = {}
    for s in sides:
        keys = ["pass@1", "k/k"] + ([f"pass@{s.k}"] if s.k > 1 and all(s.k in r["pass@k"] for r in s.runs.values()) else [])
        out[s.label] = {"k": s.k, "tasks": next(iter(s.runs.values()))["tasks"]}
        for key in keys:
            row = {}
            for run, summ in s.runs.items():
                v = summ["pass@1"] if key == "pass@1" else summ["k/k"] if key == "k/k" else summ["pass@k"][s.k]
                row[run] = float(np.round(v["value"], 6))
            for pair, cmp in s.pairs.items():
                row[f"{pair[1]}-{pair[0]}"] = cmp["metrics"][key]
            out[s.label][key] = row
    return out
