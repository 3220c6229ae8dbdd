"""agg / select / report through the CLI entry point (in process, output captured), on real
campaigns run here."""
import json
from types import SimpleNamespace

import duckdb
import pytest
import yaml

from tbhpc.campaign.runner import run_campaign
from tbhpc.campaign.config import CampaignConfig
from tbhpc.tasks.loader import default_pack_dir, load_exclusions


@pytest.fixture
def tbhpc(capsys):
    from tbhpc.cli import main

    def run(*args, ok=True):
        capsys.readouterr()
        rc = main([str(a) for a in args])
        out, err = capsys.readouterr()
        if ok:
            assert rc == 0, err
        return SimpleNamespace(returncode=rc, stdout=out, stderr=err)
    return run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    run_campaign(CampaignConfig(name="probe", kind="probe", split="all", limit=100, repeats=8, policy_opts={"skill": 0.7},
                                chunk_size=100), root / "probe")
    run_campaign(CampaignConfig(name="base", split="eval", limit=30, repeats=4, policy_opts={"skill": 0.8}, chunk_size=40), root / "base")
    run_campaign(CampaignConfig(name="tuned", split="eval", limit=30, repeats=4, chunk_size=40), root / "tuned")
    return root


def test_agg_formats(runs, tbhpc):
    js = json.loads(tbhpc("agg", runs / "base", "--format", "json").stdout)["summary"]
    assert js["tasks"] == 30 and js["attempts"] == 120 and set(js["pass@k"]) == {"1"}
    csv = tbhpc("agg", runs / "base", "--format", "csv").stdout.splitlines()
    assert csv[0] == "scenario,n,passed,pass_rate,ci_lo,ci_hi" and csv[-2].startswith("MICRO_AVG,120,") and csv[-1].startswith("MACRO_AVG")
    md = tbhpc("agg", runs / "base", "--format", "md").stdout
    assert "| pass@1 (pooled, Jeffreys 95%) |" in md and "| k/k tasks (c = n, n = 4) |" in md
    assert "per domain" in tbhpc("agg", runs / "base").stdout


def test_agg_vs_and_prices(runs, tmp_path, tbhpc):
    prices = tmp_path / "prices.yaml"
    prices.write_text("agent: {input: 1.0, cached: 0.1, output: 4.0}\nuser: {input: 0.2, output: 0.8}\n")
    out = json.loads(tbhpc("agg", runs / "tuned", "--vs", runs / "base", "--prices", prices, "--format", "json").stdout)
    m = out["comparison"]["metrics"]["pass@1"]
    # RUN is the base of the comparison, --vs the other run: delta = other - base
    assert out["comparison"]["shared_tasks"] == 30 and m["base"] == pytest.approx(out["summary"]["pass@1"]["value"]) == 1.0
    assert m["other"] < 1.0 and m["delta"] == pytest.approx(m["other"] - 1.0) and m["lo"] <= m["delta"] <= m["hi"] < 0
    assert out["summary"]["cost"]["total"] == 0.0  # scripted agents use no tokens: the cost is honestly zero
    bad = tmp_path / "bad.yaml"
    bad.write_text("agent: {inptu: 1}\n")
    err = tbhpc("agg", runs / "base", "--prices", bad, ok=False)
    assert err.returncode == 2 and "agent.inptu" in err.stderr


def test_select_writes_pool_manifest_and_table(runs, tmp_path, tbhpc):
    out = tmp_path / "pool.yaml"
    text = tbhpc("select", runs / "probe", "--out", out).stdout
    assert "bands: too_hard" in text and "excluded by id before selection:" in text
    pool = yaml.safe_load(out.read_text())
    evals = load_exclusions(default_pack_dir() / "eval_ids.txt")
    assert pool["tasks"] and not set(pool["tasks"]) & evals
    assert all(d["band"] in ("hard", "medium", "easy") and d["n"] >= 3 for d in pool["details"])
    manifest = json.loads(out.with_suffix(".manifest.json").read_text())
    assert sum(manifest["band_counts"].values()) + manifest["excluded_before_selection"] == 100
    con = duckdb.connect(str(runs / "probe" / "results.duckdb"), read_only=True)
    kept = con.execute("SELECT count(*) FROM selections WHERE selection = 'pool' AND kept").fetchone()[0]
    con.close()
    assert kept == len(pool["tasks"])
    # the pool is a task list for the next campaign
    res = run_campaign(CampaignConfig(name="onpool", tasks=str(out), repeats=1, split="all", chunk_size=100), tmp_path / "onpool")
    assert res.planned == len(pool["tasks"]) and res.missing == 0


def test_report_writes_markdown_html_and_plots(runs, tmp_path, tbhpc):
    tbhpc("report", runs / "probe", "--out", tmp_path / "rep")
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "## Difficulty bands" in md and "![k_curves](k_curves.png)" in md
    for png in ("domains.png", "k_curves.png", "rates.png", "bands.png"):
        assert (tmp_path / "rep" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (tmp_path / "rep" / "report.html").read_text()
    assert "<table>" in page and '<img alt="domains" src="domains.png">' in page
    tbhpc("report", runs / "tuned", "--vs", runs / "base", "--out", tmp_path / "cmp")
    assert "paired bootstrap" in (tmp_path / "cmp" / "report.md").read_text()
