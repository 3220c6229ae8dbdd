"""The demo's result renderers and the collapse check, on hand-made inputs (pure functions)."""
import numpy as np
import pytest

from tbhpc.demo.behaviour import global_collapse, type_markdown, type_table
from tbhpc.demo.results import cost_rows, table1_markdown
from tbhpc.metrics.agg import Counts, compare, summarise

# task id -> (template, domain, initial hash, golden hash): "refund" needs a change, "refused" none
KINDS = {"r-1": ("refund", "retail", "i1", "g1"), "r-2": ("refund", "retail", "i2", "g2"),
         "x-1": ("refused", "retail", "i3", "i3"), "x-2": ("refused", "retail", "i4", "i4")}


def rows(outcomes):
    """outcomes: task -> list of (passed, final hash)."""
    return [(t, p, h) for t, xs in outcomes.items() for p, h in xs]


def test_a_model_that_learned_both_kinds_is_not_flagged():
    warm = rows({"r-1": [(0, "i1"), (1, "g1")], "r-2": [(0, "i2"), (0, "i2")], "x-1": [(1, "i3"), (0, "z")], "x-2": [(1, "i4")] * 2})
    trained = rows({"r-1": [(1, "g1")] * 2, "r-2": [(1, "g2"), (0, "i2")], "x-1": [(1, "i3")] * 2, "x-2": [(1, "i4")] * 2})
    table = type_table(KINDS, warm, trained)
    assert [(r.template, r.golden, r.warm, r.trained) for r in table] == [("refund", "changed", 0.25, 0.75),
                                                                          ("refused", "kept", 0.75, 1.0)]
    assert table[0].trained_changed == 0.75 and table[1].trained_changed == 0.0
    assert not any(r.flag for r in table) and global_collapse(table) == ""


def test_always_refusing_is_flagged_on_the_types_that_need_a_change():
    warm = rows({"r-1": [(1, "g1")] * 10, "r-2": [(1, "g2")] * 10, "x-1": [(0, "z")] * 10, "x-2": [(0, "z")] * 10})
    refuses = rows({t: [(KINDS[t][2] == KINDS[t][3], KINDS[t][2])] * 10 for t in KINDS})   # never writes anything
    table = type_table(KINDS, warm, refuses)
    assert [r.flag != "" for r in table] == [True, False]
    assert "refuses" in table[0].flag and global_collapse(table) == "the trained model never changes the database on any task type"
    md = type_markdown(table)
    assert md.splitlines()[2].startswith("| refund | retail | 2 | changed | 1.00 | 0.00 | -1.00 | 1.00 / 0.00 | **always keeps")


def test_a_fixed_behaviour_on_a_handful_of_attempts_is_noted_not_flagged():
    """4 of 4 attempts keeping the state is what a model acting half the time does 1 time in 16."""
    warm = rows({"r-1": [(1, "g1")] * 2, "r-2": [(1, "g2")] * 2, "x-1": [(1, "i3")] * 2, "x-2": [(1, "i4")] * 2})
    refuses = rows({t: [(KINDS[t][2] == KINDS[t][3], KINDS[t][2])] * 2 for t in KINDS})
    table = type_table(KINDS, warm, refuses)
    assert [r.flag for r in table] == ["", ""]
    assert table[0].note == "always keeps the state (refuses) where the tasks need a change (on 4 attempts: too few to tell)"
    # 10 attempts per task (20 per type = MIN_ATTEMPTS) are enough to call it
    more = rows({t: [(KINDS[t][2] == KINDS[t][3], KINDS[t][2])] * 10 for t in KINDS})
    assert type_table(KINDS, warm, more)[0].flag.startswith("always keeps")


def test_a_type_the_warm_start_never_acted_on_is_noted_not_flagged():
    """Both checkpoints keep the state on a type that needs a change: the warm start's gap, not
    something training did; the same behaviour appearing only after training is flagged."""
    never = rows({"r-1": [(0, "i1")] * 2, "r-2": [(0, "i2")] * 2, "x-1": [(1, "i3")] * 2, "x-2": [(1, "i4")] * 2})
    table = type_table(KINDS, never, never)
    assert [r.flag for r in table] == ["", ""] and table[0].note.endswith("(so did the warm start)")
    assert "| 0.00 / 0.00 | always keeps the state (refuses) where the tasks need a change (so did the warm start) |" \
        in type_markdown(table)


def _counts(run, c, n=4):
    ids = np.array([f"t{i}" for i in range(len(c))])
    return Counts(run, "eval", run, ids, np.array(["retail"] * len(c)), np.full(len(c), n), np.array(c), n * len(c), 0,
                  {r: {"input": 1_000_000, "cached": 0, "output": 100_000} for r in ("agent", "user", "judge")})


def test_table1_pairs_the_two_checkpoints_and_prices_successes():
    prices = {"agent": {"input": 0.1, "output": 0.4}}
    warm, trained = _counts("warm", [0, 1, 2, 4, 4]), _counts("trained", [1, 2, 4, 4, 4])
    ws, ts = summarise(warm, prices, bootstrap=200), summarise(trained, prices, bootstrap=200)
    md = table1_markdown(ws, ts, compare(warm, trained, bootstrap=200), 4)
    lines = md.splitlines()
    assert lines[0].startswith("| metric (5 held-out tasks x 4) | warm start | trained (GRPO) |")
    assert lines[2].startswith("| pass@1 | 55.0% [") and "| 75.0% [" in lines[2] and "+20.0 pts" in lines[2]
    assert lines[3].startswith("| observed 4/4 (tasks) | 2/5 = 40.0% [") and "| 3/5 = 60.0% [" in lines[3]
    per_success, per_reliable = cost_rows(ts)
    assert ts["cost"]["total"] == pytest.approx(0.14) and per_success.startswith("$0.009333 [$")   # 0.14 / 15 successes
    assert per_reliable.startswith("$0.04667 [$")                                                   # 0.14 / 3 tasks


def test_table1_at_twenty_repeats_shows_pass_at_20_and_the_standard_pass_hat_ks():
    """k = 20 (the demo's eval): pass@20, pass^5 and pass^20 rows (the standard ks the metrics compute)."""
    warm, trained = _counts("warm", [0, 3, 10, 20, 20], n=20), _counts("trained", [1, 8, 15, 20, 20], n=20)
    md = table1_markdown(summarise(warm, bootstrap=100), summarise(trained, bootstrap=100),
                         compare(warm, trained, bootstrap=100), 20)
    names = [ln.split(" | ")[0].lstrip("| ") for ln in md.splitlines()[2:]]
    assert names == ["pass@1", "observed 20/20 (tasks)", "pass@20", "pass^5", "pass^20", "cost per success",
                     "cost per reliable (20/20) task"]
    assert "| pass@20 | 80.0% [" in md            # the warm start: 4 of 5 tasks pass at least once


def test_a_sample_of_each_split_spans_every_domain_and_stays_in_its_split(tmp_path):
    from tbhpc.campaign.config import campaign_tasks
    from tbhpc.demo.config import DemoConfig
    from tbhpc.demo.pipeline import campaign, sample_file
    from tbhpc.errors import UserError
    from tbhpc.tasks.select import select_tasks
    cfg = DemoConfig(out=str(tmp_path / "demo"), sample=24, pack="full")
    for split in ("train", "eval"):
        whole = [t.id for t in select_tasks(split=split)]
        ids = sample_file(cfg, split).read_text().split()
        assert len(ids) == len(set(ids)) == 24 and set(ids) <= set(whole)
        assert ids == sorted(ids, key=whole.index)                       # evenly spaced, in the split's order
        assert {i.split("-")[0] for i in ids} == {i.split("-")[0] for i in whole}   # every domain
        tasks = campaign_tasks(campaign(cfg, "x", "eval", split, 1, "m"))
        assert [t.id for t in tasks] == ids and {t.split for t in tasks} == {split}
    (tmp_path / "demo" / "sample-eval.txt").write_text("eval-task\n")     # written once: a resumed demo keeps its sample
    assert sample_file(cfg, "eval").read_text() == "eval-task\n"
    with pytest.raises(UserError, match="'sample'"):
        DemoConfig(sample=3, tasks="jobs/pools/smoke.yaml")


def test_the_comparison_pairs_grpo_against_its_start_and_each_baseline():
    from tbhpc.demo.comparison import PAIRS, Side, as_summary, comparison_markdown, template_markdown, template_rates, verdict
    counts = {key: _counts(key, c, n=20) for key, c in (("warm", [10, 18, 20, 5]), ("trained", [20, 20, 20, 6]),
                                                        ("rft", [12, 19, 20, 4]), ("sft", [20, 20, 19, 20]))}
    runs = {key: summarise(c, bootstrap=200) for key, c in counts.items()}
    pairs = {(a, b): compare(counts[a], counts[b], bootstrap=200) for a, b in PAIRS}
    side = Side("held-out", 20, runs, pairs, "base")
    lines = comparison_markdown([side]).splitlines()
    assert lines[0] == "held-out (4 tasks x 20):"
    assert lines[2] == ("| metric | base | GRPO | RFT | oracle SFT | GRPO - base, pts | RFT - base, pts | GRPO - RFT, pts | "
                        "GRPO - oracle SFT, pts |")
    p1 = lines[4].split(" | ")
    assert p1[0] == "| pass@1" and p1[1].startswith("66.2% [") and p1[2].startswith("82.5% [") and p1[3].startswith("68.8% [")
    assert p1[5].startswith("+16.2 [") and p1[6].startswith("+2.5 [") and p1[7].startswith("+13.8 [")   # (66 - 55) / 80
    assert p1[8].startswith("-16.2 [")                                 # (66 - 79) / 80
    kk = lines[5].split(" | ")
    assert kk[0] == "| pass^20 (all 20 of 20)" and "(1/4)" in kk[1] and "(3/4)" in kk[2] and "(1/4)" in kk[3]
    assert kk[5].startswith("+50.0 [") and kk[7].startswith("+50.0 [") and lines[6].startswith("| pass@20 |")
    said = verdict([side])
    assert "held-out: GRPO's pass@1 is" in said and "GRPO - RFT on pass^20 +50.0 pts, >= 0" in said
    assert "pass@20 +0.0 pts (within 2 pts)" in said
    kept = as_summary([side])["held-out"]
    assert kept["k/k"]["rft"] == 0.25 and kept["k/k"]["trained"] == 0.75 and kept["tasks"] == 4
    assert kept["pass@1"]["trained-rft"]["delta"] == pytest.approx(kept["pass@1"]["trained"] - kept["pass@1"]["rft"])
    template_of = {"t0": "a/x", "t1": "a/x", "t2": "b/y", "t3": "b/y"}
    md = template_markdown({key: template_rates(counts[key], template_of) for key in ("warm", "rft", "trained")}, 20,
                           {"warm": "base", "rft": "RFT", "trained": "GRPO"}).splitlines()
    assert md[0] == ("| task type | tasks | base pass@1 | RFT pass@1 | GRPO pass@1 | GRPO - base | GRPO - RFT | "
                     "20/20: base / RFT / GRPO |")
    assert md[2] == "| a/x | 2 | 0.70 | 0.78 | 1.00 | +0.30 | +0.22 | 0 / 0 / 2 |"
    assert md[3] == "| b/y | 2 | 0.62 | 0.60 | 0.65 | +0.03 | +0.05 | 1 / 1 / 1 |"
