"""Campaign summaries: pass@1, pass@k, pass^k (two forms), k/k, per domain, costs, paired deltas.

Everything is computed from per-task counts (n clean runs, c successes) fetched from DuckDB in one
GROUP BY, so a million-attempt campaign aggregates in the time it takes DuckDB to count it.
"""
from __future__ import annotations

import math

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from tbhpc.errors import UserError
from tbhpc.metrics.stats import (bootstrap_means, jeffreys_interval, ks_for, pass_at_k, pass_hat_k,
                                 pass_hat_k_reference, percentile_interval, wilson_interval)
from tbhpc.store.merge import connect
from tbhpc.store.run_dir import RunDir
from tbhpc.store.schema import ROLES

PRICE_KINDS = ("input", "cached", "output")


@dataclass
class Counts:
    """Per-task counts of one campaign (arrays aligned by task)."""

    run: str
    campaign: str
    policy_id: str
    task_ids: np.ndarray
    domains: np.ndarray
    n: np.ndarray           # clean runs
    c: np.ndarray           # successes
    rows: int               # all attempt rows
    system_errors: int
    usage: dict[str, dict[str, int]]


def load_counts(run: RunDir) -> Counts:
    camp = run.require().campaign()
    if not run.db.exists():
        raise UserError(f"{run.path}: no results.duckdb yet (run `tbhpc merge {run.path}`)")
    con = connect(run, read_only=True)
    try:
        key = [camp["campaign"], camp["policy_id"]]
        stats = con.execute("SELECT task_id, domain, n, c FROM task_stats WHERE campaign = ? AND policy_id = ? ORDER BY task_id",
                            key).fetchnumpy()
        tok = ", ".join(f"sum({r}_{k})::BIGINT" for r in ROLES for k in ("in", "cached", "out"))
        row = con.execute(f"SELECT count(*), count(*) FILTER (WHERE status = 'system_error'), {tok} FROM attempts "
                          "WHERE campaign = ? AND policy_id = ?", key).fetchone()
    finally:
        con.close()
    vals = [int(v or 0) for v in row[2:]]
    usage = {r: dict(zip(PRICE_KINDS, vals[3 * i: 3 * i + 3])) for i, r in enumerate(ROLES)}
    return Counts(str(run.path), camp["campaign"], camp["policy_id"], stats["task_id"].astype(str),
                  stats["domain"].astype(str), stats["n"].astype(np.int64), stats["c"].astype(np.int64),
                  int(row[0]), int(row[1]), usage)


def _ci(value: float, lo: float, hi: float) -> dict:
    return {"value": float(value), "lo": float(lo), "hi": float(hi)}


def _task_share(count: int, tasks: int) -> dict:
    """A share of tasks (k/k, >=1) with the Jeffreys interval over the task count: a bootstrap over
    tasks of a 0/1 indicator collapses to [0, 0] when no task qualifies (and to [1, 1] when all do)."""
    return {"count": count, **_ci(count / tasks, *jeffreys_interval(count, tasks))}


def per_task_metrics(n: np.ndarray, c: np.ndarray, ks: list[int]) -> tuple[list[str], np.ndarray]:
    """Columns: pass@1 per task, pass@k, pass^k unbiased, pass^k reference, k/k, >=1."""
    names, cols = ["pass@1"], [c / np.maximum(n, 1)]
    for k in ks:
        names += [f"pass@{k}", f"pass^{k}", f"pass^{k}_ref"]
        cols += [pass_at_k(n, c, k), pass_hat_k(n, c, k), pass_hat_k_reference(n, c, k)]
    names += ["k/k", ">=1"]
    cols += [(c == n).astype(float), (c >= 1).astype(float)]
    return names, np.stack(cols, axis=1)


def summarise(counts: Counts, prices: dict | None = None, bootstrap: int = 1000, seed: int = 0) -> dict:
    keep = counts.n > 0
    n, c, domains = counts.n[keep], counts.c[keep], counts.domains[keep]
    if n.size == 0:
        raise UserError(f"{counts.run}: no clean attempts to aggregate")
    ks = ks_for(int(n.min()))
    names, per_task = per_task_metrics(n, c, ks)
    lo, hi = percentile_interval(bootstrap_means(per_task, bootstrap, seed)) if bootstrap else (per_task.mean(0),) * 2
    mean = per_task.mean(axis=0)
    col = {name: i for i, name in enumerate(names)}
    total_c, total_n = int(c.sum()), int(n.sum())
    kk = int((c == n).sum())
    out = {
        "run": counts.run, "campaign": counts.campaign, "policy_id": counts.policy_id,
        "tasks": int(n.size), "attempts": counts.rows, "clean_attempts": total_n, "successes": total_c,
        "system_errors": counts.system_errors, "runs_per_task": {"min": int(n.min()), "max": int(n.max())},
        "pass@1": _ci(total_c / total_n, *jeffreys_interval(total_c, total_n)),
        "pass@k": {k: _ci(mean[col[f"pass@{k}"]], lo[col[f"pass@{k}"]], hi[col[f"pass@{k}"]]) for k in ks},
        "pass^k": {k: {"unbiased": _ci(mean[col[f"pass^{k}"]], lo[col[f"pass^{k}"]], hi[col[f"pass^{k}"]]),
                       "reference": _ci(mean[col[f"pass^{k}_ref"]], lo[col[f"pass^{k}_ref"]], hi[col[f"pass^{k}_ref"]])}
                   for k in ks},
        "k/k": _task_share(kk, int(n.size)),
        ">=1": _task_share(int((c >= 1).sum()), int(n.size)),
        "by_domain": by_domain(n, c, domains),
    }
    if prices:
        out["cost"] = cost(counts.usage, prices, total_c, kk)
    return out


def by_domain(n: np.ndarray, c: np.ndarray, domains: np.ndarray) -> dict:
    rows = []
    for dom in sorted(set(domains.tolist())):
        m = domains == dom
        dn, dc = int(n[m].sum()), int(c[m].sum())
        lo, hi = wilson_interval(dc, dn)
        rows.append({"domain": dom, "tasks": int(m.sum()), "n": dn, "passed": dc, "pass_rate": dc / dn, "ci_lo": lo, "ci_hi": hi,
                     "k/k": int((c[m] == n[m]).sum())})
    tn, tc = int(n.sum()), int(c.sum())
    micro = {"n": tn, "passed": tc, "pass_rate": tc / tn, **dict(zip(("ci_lo", "ci_hi"), wilson_interval(tc, tn)))}
    macro = {"pass_rate": float(np.mean([r["pass_rate"] for r in rows]))}
    return {"domains": rows, "micro": micro, "macro": macro}


def load_prices(path: Path | str) -> dict:
    """YAML: {agent|user|judge: {input, cached, output}} in USD per million tokens."""
    try:
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise UserError(f"{path}: cannot read price table: {exc}") from None
    if not isinstance(doc, dict):
        raise UserError(f"{path}: expected a mapping of roles ({', '.join(ROLES)}) to prices, got {type(doc).__name__}")
    for role, table in doc.items():
        if role not in ROLES:
            raise UserError(f"{path}: unknown role {role!r} (known: {', '.join(ROLES)})")
        if not isinstance(table or {}, dict):
            raise UserError(f"{path}: {role}: expected a mapping of {', '.join(PRICE_KINDS)} to numbers, got {table!r}")
        for kind, value in (table or {}).items():
            if kind not in PRICE_KINDS or not isinstance(value, (int, float)) or isinstance(value, bool):
                raise UserError(f"{path}: {role}.{kind}: expected one of {', '.join(PRICE_KINDS)} with a number (USD per 1M tokens)")
            if not (math.isfinite(value) and value >= 0):
                raise UserError(f"{path}: {role}.{kind}: a price must be a finite number >= 0 (USD per 1M tokens), got {value}")
    return doc


def cost(usage: dict[str, dict[str, int]], prices: dict, successes: int, reliable_tasks: int) -> dict:
    """Input tokens include cached ones; cached tokens are billed at the cached price."""
    by_role = {}
    for role in ROLES:
        p, u = prices.get(role) or {}, usage[role]
        uncached = u["input"] - u["cached"]
        by_role[role] = (uncached * p.get("input", 0) + u["cached"] * p.get("cached", p.get("input", 0))
                         + u["output"] * p.get("output", 0)) / 1e6
    total = sum(by_role.values())
    return {"total": total, "by_role": by_role,
            "per_success": total / successes if successes else None,
            "per_reliable_task": total / reliable_tasks if reliable_tasks else None}


def compare(a: Counts, b: Counts, bootstrap: int = 1000, seed: int = 0) -> dict:
    """Paired comparison (b - a) on the tasks both runs share, with paired bootstrap intervals."""
    ia = {t: i for i, t in enumerate(a.task_ids.tolist()) if a.n[i] > 0}
    ib = {t: i for i, t in enumerate(b.task_ids.tolist()) if b.n[i] > 0}
    shared = sorted(set(ia) & set(ib))
    if not shared:
        raise UserError(f"{a.run} and {b.run} share no tasks with clean runs")
    sa, sb = np.array([ia[t] for t in shared]), np.array([ib[t] for t in shared])
    ks = ks_for(int(min(a.n[sa].min(), b.n[sb].min())))
    names, ma = per_task_metrics(a.n[sa], a.c[sa], ks)
    _, mb = per_task_metrics(b.n[sb], b.c[sb], ks)
    diff = mb - ma
    lo, hi = percentile_interval(bootstrap_means(diff, bootstrap, seed)) if bootstrap else (diff.mean(0),) * 2
    return {"base": a.run, "other": b.run, "shared_tasks": len(shared),
            "metrics": {name: {"base": float(ma[:, i].mean()), "other": float(mb[:, i].mean()),
                               "delta": float(diff[:, i].mean()), "lo": float(lo[i]), "hi": float(hi[i])}
                        for i, name in enumerate(names)}}
