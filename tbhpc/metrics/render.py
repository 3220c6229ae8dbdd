"""Render a summary (from `agg.summarise`) as Markdown, CSV, JSON or a rich table.

Pure functions of the summary dict, so outputs can be golden-tested. The CSV keeps the layout of
the reference's per-domain summary (`scenario,n,passed,pass_rate,ci_lo,ci_hi` plus MICRO_AVG and
MACRO_AVG rows) so existing spreadsheets keep working.
"""
from __future__ import annotations

import json

from rich.table import Table


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def ci(d: dict) -> str:
    return f"{pct(d['value'])} [{pct(d['lo'])}, {pct(d['hi'])}]"


def headline_rows(s: dict) -> list[tuple[str, str]]:
    rows = [("tasks", str(s["tasks"])), ("attempts (clean / all)", f"{s['clean_attempts']} / {s['attempts']}"),
            ("system errors", str(s["system_errors"])),
            ("pass@1 (pooled, Jeffreys 95%)", ci(s["pass@1"]))]
    for k, v in s["pass@k"].items():
        if k > 1:  # pass@1 = pass^1 = the pooled rate above when runs per task are equal
            rows.append((f"pass@{k} (unbiased)", ci(v)))
    for k, v in s["pass^k"].items():
        if k == 1:
            continue
        rows.append((f"pass^{k} unbiased C(c,k)/C(n,k)", ci(v["unbiased"])))
        rows.append((f"pass^{k} reference (c/n)^k", ci(v["reference"])))
    n_max = s["runs_per_task"]["max"]
    rows.append((f"k/k tasks (c = n, n = {n_max})", f"{s['k/k']['count']} = {ci(s['k/k'])}"))
    rows.append((">=1 success tasks", f"{s['>=1']['count']} = {ci(s['>=1'])}"))
    if "cost" in s:
        cst = s["cost"]
        rows.append(("cost (USD)", f"{cst['total']:.4f} (agent {cst['by_role']['agent']:.4f}, user {cst['by_role']['user']:.4f}, "
                                   f"judge {cst['by_role']['judge']:.4f})"))
        rows.append(("cost per successful attempt", "-" if cst["per_success"] is None else f"{cst['per_success']:.6f}"))
        rows.append(("cost per reliable (k/k) task", "-" if cst["per_reliable_task"] is None else f"{cst['per_reliable_task']:.6f}"))
    return rows


def domain_rows(s: dict) -> list[list[str]]:
    bd = s["by_domain"]
    rows = [[d["domain"], str(d["tasks"]), str(d["n"]), str(d["passed"]), pct(d["pass_rate"]),
             f"[{pct(d['ci_lo'])}, {pct(d['ci_hi'])}]", str(d["k/k"])] for d in bd["domains"]]
    m = bd["micro"]
    rows.append(["MICRO_AVG", str(s["tasks"]), str(m["n"]), str(m["passed"]), pct(m["pass_rate"]),
                 f"[{pct(m['ci_lo'])}, {pct(m['ci_hi'])}]", str(s["k/k"]["count"])])
    rows.append(["MACRO_AVG", "", "", "", pct(bd["macro"]["pass_rate"]), "", ""])
    return rows


DOMAIN_HEADER = ["domain", "tasks", "attempts", "passed", "pass@1", "Wilson 95%", "k/k"]


def to_markdown(s: dict, title: str | None = None) -> str:
    lines = [f"## {title or s['campaign']} ({s['policy_id']})", "", "| metric | value |", "|---|---|"]
    lines += [f"| {a} | {b} |" for a, b in headline_rows(s)]
    lines += ["", "| " + " | ".join(DOMAIN_HEADER) + " |", "|" + "---|" * len(DOMAIN_HEADER)]
    lines += ["| " + " | ".join(r) + " |" for r in domain_rows(s)]
    return "\n".join(lines) + "\n"


def to_csv(s: dict) -> str:
    out = ["scenario,n,passed,pass_rate,ci_lo,ci_hi"]
    for d in s["by_domain"]["domains"]:
        out.append(f"{d['domain']},{d['n']},{d['passed']},{d['pass_rate']:.6f},{d['ci_lo']:.6f},{d['ci_hi']:.6f}")
    m = s["by_domain"]["micro"]
    out.append(f"MICRO_AVG,{m['n']},{m['passed']},{m['pass_rate']:.6f},{m['ci_lo']:.6f},{m['ci_hi']:.6f}")
    out.append(f"MACRO_AVG,,,{s['by_domain']['macro']['pass_rate']:.6f},,")
    return "\n".join(out) + "\n"


def to_json(obj: dict) -> str:
    return json.dumps(obj, indent=1, sort_keys=False, default=str) + "\n"


def to_tables(s: dict) -> list[Table]:
    head = Table(title=f"{s['campaign']} ({s['policy_id']})", show_header=False)
    head.add_column("metric")
    head.add_column("value", justify="right")
    for a, b in headline_rows(s):
        head.add_row(a, b)
    dom = Table(title="per domain")
    for h in DOMAIN_HEADER:
        dom.add_column(h, justify="left" if h == "domain" else "right")
    for r in domain_rows(s):
        dom.add_row(*r)
    return [head, dom]


def comparison_markdown(cmp: dict) -> str:
    lines = [f"## {cmp['other']} vs {cmp['base']} ({cmp['shared_tasks']} shared tasks, paired bootstrap 95%)", "",
             "| metric | base | other | delta | 95% interval |", "|---|---|---|---|---|"]
    for name, m in cmp["metrics"].items():
        if name in ("pass^1", "pass^1_ref"):  # both equal pass@1
            continue
        lines.append(f"| {name} | {pct(m['base'])} | {pct(m['other'])} | {100 * m['delta']:+.1f} pts | "
                     f"[{100 * m['lo']:+.1f}, {100 * m['hi']:+.1f}] |")
    return "\n".join(lines) + "\n"
