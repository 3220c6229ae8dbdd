"""The demo's results: Table 1 (start vs GRPO on the held-out split), the comparison with the
baselines (demo/comparison.py), per domain, per task type with the collapse check, and the plots,
all computed from the runs' DuckDB files.

`table1_markdown` is a pure function of two summaries and their paired comparison (golden-
testable). Cost intervals: the campaign's total cost is fixed by its token counts, so the
interval of cost per success is the total over the Jeffreys interval of the successes (and per
reliable task over the Jeffreys interval of the k/k task count).
"""
from __future__ import annotations

from pathlib import Path

from rich.console import Console

from tbhpc.demo.behaviour import attempt_outcomes, global_collapse, task_kinds, type_markdown, type_table
from tbhpc.demo.comparison import FOOTNOTE, LABELS, PAIRS, Side, as_summary, comparison_markdown, template_markdown
from tbhpc.demo.comparison import template_rates
from tbhpc.demo.comparison import verdict as goal_verdict
from tbhpc.metrics import render
from tbhpc.metrics.agg import compare, load_counts, load_prices, summarise
from tbhpc.report import plots
from tbhpc.report.build import markdown_to_html
from tbhpc.store.run_dir import RunDir


def _money(x: float | None) -> str:
    return "-" if x is None else f"${x:.4g}"


def _cost_interval(total: float, count_lo: float, count_hi: float) -> str:
    if count_hi <= 0:
        return "-"
    lo = total / count_hi
    return f"[{_money(lo)}, {'∞' if count_lo <= 0 else _money(total / count_lo)}]"


def cost_rows(s: dict) -> tuple[str, str]:
    """(cost per success, cost per reliable task), each with its interval."""
    cst = s.get("cost")
    if not cst:
        return "-", "-"
    n, tasks = s["clean_attempts"], s["tasks"]
    p1, kk = s["pass@1"], s["k/k"]
    per_success = f"{_money(cst['per_success'])} {_cost_interval(cst['total'], p1['lo'] * n, p1['hi'] * n)}"
    per_reliable = f"{_money(cst['per_reliable_task'])} {_cost_interval(cst['total'], kk['lo'] * tasks, kk['hi'] * tasks)}"
    return per_success, per_reliable


def table1_markdown(warm: dict, trained: dict, cmp: dict, k: int, label: str = "trained (GRPO)",
                    start: str = "warm start") -> str:
    """Table 1: warm start vs trained, with intervals and the paired difference."""
    m = cmp["metrics"]

    def delta(name: str) -> str:
        d = m.get(name)
        return "-" if d is None else f"{100 * d['delta']:+.1f} pts [{100 * d['lo']:+.1f}, {100 * d['hi']:+.1f}]"

    def kk(s: dict) -> str:
        return f"{s['k/k']['count']}/{s['tasks']} = {render.ci(s['k/k'])}"

    ws, wr = cost_rows(warm)
    ts, tr = cost_rows(trained)
    lines = [f"| metric ({warm['tasks']} held-out tasks x {k}) | {start} | {label} | Δ paired bootstrap 95% |",
             "|---|---|---|---|",
             f"| pass@1 | {render.ci(warm['pass@1'])} | {render.ci(trained['pass@1'])} | {delta('pass@1')} |",
             f"| observed {k}/{k} (tasks) | {kk(warm)} | {kk(trained)} | {delta('k/k')} |"]
    if k in warm["pass@k"] and k > 1:
        lines.append(f"| pass@{k} | {render.ci(warm['pass@k'][k])} | {render.ci(trained['pass@k'][k])} | {delta(f'pass@{k}')} |")
        ks = [j for j in sorted(warm["pass^k"]) if j > 1 and j in trained["pass^k"]]     # the standard ks <= k
        for j in sorted({ks[0], ks[-1]} if ks else set()):
            lines.append(f"| pass^{j} | {render.ci(warm['pass^k'][j]['unbiased'])} | "
                         f"{render.ci(trained['pass^k'][j]['unbiased'])} | {delta(f'pass^{j}')} |")
    lines += [f"| cost per success | {ws} | {ts} | |", f"| cost per reliable ({k}/{k}) task | {wr} | {tr} | |"]
    return "\n".join(lines)


def domain_markdown(warm: dict, trained: dict) -> str:
    t = {d["domain"]: d for d in trained["by_domain"]["domains"]}
    lines = ["| domain | tasks | warm pass@1 | trained pass@1 | warm k/k | trained k/k |", "|---|---|---|---|---|---|"]
    for d in warm["by_domain"]["domains"]:
        o = t.get(d["domain"])
        if o:
            lines.append(f"| {d['domain']} | {d['tasks']} | {render.pct(d['pass_rate'])} | {render.pct(o['pass_rate'])} | "
                         f"{d['k/k']} | {o['k/k']} |")
    return "\n".join(lines)


def start_label(cfg) -> str:
    """What the start is called in the report: the demo pack's base or plateau, else the warm start."""
    if cfg.start == "plateau":
        return "plateau"
    return "base" if cfg.pack == "demo" and cfg.model == "tiny" else "warm start"


def comparison_sides(out: Path, cfg, prices: dict | None) -> list[Side]:
    """Held-out and (when run) fresh instances: every evaluated run of start, GRPO and the baselines,
    and the paired differences of PAIRS among those that exist."""
    sides = []
    for prefix, label, k in (("eval", "held-out", cfg.eval_repeats), ("fresh", "fresh", cfg.fresh_repeats)):
        present = [key for key in LABELS if (out / f"{prefix}-{key}" / "results.duckdb").exists()]
        if "warm" not in present or "trained" not in present or len(present) < 3:
            continue
        counts = {key: load_counts(RunDir(out / f"{prefix}-{key}")) for key in present}
        runs = {key: summarise(c, prices) for key, c in counts.items()}
        pairs = {(a, b): compare(counts[a], counts[b]) for a, b in PAIRS if a in counts and b in counts}
        sides.append(Side(label, k, runs, pairs, start_label(cfg)))
    return sides


def write_results(out: Path, cfg, console: Console) -> dict:
    from tbhpc.campaign.worker import run_tasks
    from tbhpc.config import load_config
    from tbhpc.campaign.config import CampaignConfig
    from tbhpc.train.record import read_steps

    prices = load_prices(cfg.prices) if cfg.prices and Path(cfg.prices).exists() else None
    warm_run, trained_run = RunDir(out / "eval-warm"), RunDir(out / "eval-trained")
    wc, tc = load_counts(warm_run), load_counts(trained_run)
    ws, ts = summarise(wc, prices), summarise(tc, prices)
    cmp = compare(wc, tc)
    k = cfg.eval_repeats
    report = out / "report"
    report.mkdir(parents=True, exist_ok=True)

    tasks = run_tasks(warm_run, load_config(CampaignConfig, warm_run.config_file))
    kinds = task_kinds(tasks)
    types = type_table(kinds, attempt_outcomes(warm_run.path), attempt_outcomes(trained_run.path))
    flagged = [r for r in types if r.flag]
    collapse = global_collapse(types)

    steps = read_steps(RunDir(out / "train"))
    images = [plots.train_curves(steps, report / "train_curves.png")] if steps else []
    runs = [("warm start", wc), ("trained", tc)]
    names = {**LABELS, "warm": start_label(cfg)}
    k_runs = [(names["warm"], wc), ("GRPO", tc)] + [(LABELS[b], load_counts(RunDir(out / f"eval-{b}"))) for b in cfg.baselines
                                                     if (out / f"eval-{b}" / "results.duckdb").exists()]
    images += [plots.domain_bars(runs, report / "domains.png"), plots.k_curves(k_runs, report / "k_curves.png")]
    t1 = table1_markdown(ws, ts, cmp, k, start=names["warm"])
    d1 = cmp["metrics"]["pass@1"]
    verdict = (f"the trained checkpoint beats the {names['warm']} (pass@1 interval excludes 0)" if d1["lo"] > 0 else
               "no significant pass@1 gain (the paired interval includes 0)" if d1["hi"] >= 0 else
               f"the trained checkpoint is WORSE than the {names['warm']}")
    baseline, summary_extra = [], {}
    sides = comparison_sides(out, cfg, prices) if cfg.baselines else []
    if sides:
        template_of = {tid: f"{dom}/{template}" for tid, (template, dom, _, _) in kinds.items()}
        rates = {key: template_rates(load_counts(RunDir(out / f"eval-{key}")), template_of) for key in sides[0].runs}
        with_rft = "rft" in sides[0].runs
        baseline = ["## GRPO against " + ("RFT, " if with_rft else "") + "its start" + (" and oracle SFT" if "sft" in sides[0].runs else "")
                    + ", all from the same start, for the same wall time", "",
                    FOOTNOTE + " Paired over tasks (bootstrap 95%).", "", comparison_markdown(sides), "",
                    goal_verdict(sides), "",
                    f"Per task type (held-out, {k} repeats):", "", template_markdown(rates, k, names), ""]
        summary_extra = {"comparison": as_summary(sides),
                         "baselines": {key: {"summary": sides[0].runs[key]} for key in sides[0].runs if key in ("rft", "sft")}}
    fresh = []
    if (out / "fresh-trained" / "results.duckdb").exists():
        fw, ft = load_counts(RunDir(out / "fresh-warm")), load_counts(RunDir(out / "fresh-trained"))
        fws, fts, fcmp = summarise(fw, prices), summarise(ft, prices), compare(fw, ft)
        fresh = [f"## Fresh instances (generator seed {cfg.fresh_seed}, drawn after training)", "",
                 "The same templates, instances nobody trained, tuned or selected on.", "",
                 table1_markdown(fws, fts, fcmp, cfg.fresh_repeats, start=start_label(cfg)), ""]
        summary_extra["fresh"] = {"seed": cfg.fresh_seed, "warm": fws, "trained": fts, "compare": fcmp}
    md = "\n".join([
        "# tbhpc demo: GRPO on the policy-relative pool, evaluated on held-out tasks", "",
        f"{names['warm'].capitalize()} `{wc.policy_id}` vs trained `{tc.policy_id}`; {verdict}.", "",
        "## Table 1", "", t1, "", *fresh, *baseline,
        "## Per domain", "", domain_markdown(ws, ts), "",
        "## Per task type (collapse check)", "",
        f"Flagged types: {len(flagged)}" + (f"; {collapse}" if collapse else "; no global collapse") + ".", "",
        type_markdown(types), "",
        "## Plots", ""] + [f"![{p.stem}]({p.name})" for p in images]) + "\n"
    (report / "README.md").write_text(md, encoding="utf-8")
    (report / "report.html").write_text(markdown_to_html(md, "tbhpc demo"), encoding="utf-8")
    console.print(t1)
    if fresh:
        console.print(fresh[0][3:])
        console.print(fresh[4])
    if baseline:
        console.print(baseline[0][3:])
        console.print(baseline[4])
        console.print(baseline[6])
        console.print(baseline[8] + "\n" + baseline[10])
    console.print(f"   {verdict}; task types flagged by the collapse check: {len(flagged)}" + (f" ({collapse})" if collapse else ""))
    console.print("   plots: " + ", ".join(str(p) for p in images))
    return {"table1": {"warm": ws, "trained": ts, "compare": cmp}, "types_flagged": [r.template for r in flagged],
            "collapse": collapse, "verdict": verdict, "pool": str(out / "pool.yaml"), **summary_extra}
