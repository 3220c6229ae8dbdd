"""`make demo` on the demo pack, shrunk: the committed base (models/demo-pack-warm) through
probe -> select -> GRPO, RFT and SFT on oracle demonstrations for GRPO's time -> eval -> fresh-seed
eval -> Table 1 and the comparison, on an evenly spaced sample of 11 tasks per split (one per
template) and 2 training steps. What it checks is the pipeline's bookkeeping on the pack `make demo`
runs: the pool is a subset of the train split with no eval id, RFT ran through the trainer on the
same pool with GRPO's measured time, every table is what the DuckDB files say, the fresh instances
are none of the pack's, the median oracle episode is printed and within the pack's 300-token budget
with the committed tokenizer, and the export loads in transformers and serves in vLLM. The
learning itself is measured by docs/demo.md's full runs, not here (2 steps move nothing measurable)."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import duckdb
import numpy as np
import pytest
import yaml

from tbhpc.serve.config import default_vllm_python

from helpers import cpu_class

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
WARM = REPO / "models" / "demo-pack-warm"          # the base: the gate's checkpoint (the demo's start)
PLATEAU = REPO / "models" / "demo-pack-plateau"    # `make demo START=plateau`'s start (its SFT continued from the base)
SMALL = ["sample=11", "probe_repeats=4", "eval_repeats=3", "fresh_repeats=1", "fresh_per_template=3", "workers=1", "concurrency=16",
         "train={steps: 2, groups_per_step: 2, max_draws: 8, torch_threads: 1, episodes_in_flight: 16}"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo-pack") / "demo"
    res = subprocess.run([sys.executable, "-m", "tbhpc.cli", "demo", "--config", "jobs/demo-pack.yaml", f"out={out}",
                          *SMALL], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    return out, " ".join(res.stdout.split())        # rich wraps long lines


def _content(tasks) -> set[tuple]:
    """What makes an instance (the request and the rows it patches in), whatever its id."""
    return {(t.query, json.dumps([t.user_context, t.data_patch], sort_keys=True, default=str)) for t in tasks}


def test_the_committed_warm_start_was_chosen_by_the_gate():
    sel = json.loads((WARM / "selection.json").read_text())
    chosen = sel["chosen"]
    assert chosen == sel["history"][-1] and 0.5 <= chosen["pass_at_1"] <= 0.85
    assert all(0 < r < 1 for r in chosen["per_type"].values()) and len(chosen["per_type"]) == 11
    assert all(not (0.5 <= h["pass_at_1"] <= 0.85 and all(0 < r < 1 for r in h["per_type"].values()))
               for h in sel["history"][:-1])          # the first checkpoint inside the band, not a later one


def test_the_committed_plateau_is_where_held_out_pass_at_1_stopped_rising():
    sel = json.loads((PLATEAU / "selection.json").read_text())
    gate, history, chosen = sel["gate"], sel["history"], sel["chosen"]
    assert history[0]["step"] == 0 and all(h["phase_gate"] == "plateau" for h in history)   # the curve starts at the base
    best = max(h["pass_at_1"] for h in history)       # a later one may top it by less than min_delta
    assert best - gate["min_delta"] <= chosen["pass_at_1"] <= best and chosen["pass_at_1"] > history[0]["pass_at_1"]
    after = [h for h in history if h["step"] > chosen["step"]]
    assert len(after) == gate["patience"]                          # it ended `patience` evaluations after the best
    assert all(h["pass_at_1"] <= chosen["pass_at_1"] + gate["min_delta"] for h in after)


def test_every_stage_runs_on_the_demo_pack(run):
    out, log = run
    for stage in ("1. policy", "2. probe", "3. select", "4. train", "4b. baselines", "5. evaluate",
                  "5b. fresh instances", "6. report", "demo finished"):
        assert stage in log, stage
    median = re.search(r"an oracle episode is (\d+) tokens", log)
    assert median and int(median.group(1)) <= 300, log[:2000]
    for f in ("probe/results.duckdb", "pool.yaml", "train/exports/step-000002/config.json", "eval-warm/results.duckdb",
              "eval-trained/results.duckdb", "fresh-warm/results.duckdb", "fresh-trained/results.duckdb",
              "fresh-pack-s2027-x3/eval_ids.txt", "sft-baseline/config.json", "eval-sft/results.duckdb", "fresh-sft/results.duckdb",
              "eval-rft/results.duckdb", "fresh-rft/results.duckdb", "report/README.md", "demo.json"):
        assert (out / f).exists(), f


def test_the_pool_is_candidates_the_plateau_never_saw_and_the_fresh_instances_are_new(run):
    """The probe and the pool are candidate instances (seed candidates_seed), train split only,
    none with the content of an instance of the bundled pack (whose train split the SFT learnt)."""
    from tbhpc.tasks.loader import load_exclusions, load_pack
    out, _ = run
    pack = load_pack("demo")
    demo = yaml.safe_load((REPO / "jobs/demo-pack.yaml").read_text())
    candidates = load_pack(out / f"candidates-s{demo['candidates_seed']}-x{demo['candidates_per_template']}")
    assert len(candidates) == 11 * demo["candidates_per_template"] and {t.split for t in candidates} == {"train"}
    assert not _content(candidates) & _content(pack)
    eval_ids = load_exclusions(REPO / "tbhpc/data/packs/demo/eval_ids.txt")
    pool = yaml.safe_load((out / "pool.yaml").read_text())["tasks"]
    probed = {r[0] for r in duckdb.connect(str(out / "probe/results.duckdb"), read_only=True).execute(
        "SELECT DISTINCT task_id FROM attempts").fetchall()}
    assert len(probed) == 11 and probed <= {t.id for t in candidates}
    assert set(pool) <= probed and not set(pool) & eval_ids
    fresh = load_pack(out / "fresh-pack-s2027-x3")
    assert len(fresh) == 33 and not {t.id for t in fresh} & {t.id for t in pack}
    assert 11 * demo["fresh_per_template"] >= 300 and demo["fresh_repeats"] >= 4      # what `make demo` evaluates
    assert not _content(fresh) & _content(pack)


def test_both_tables_are_what_the_duckdb_files_say(run):
    out, _ = run
    summary = json.loads((out / "demo.json").read_text())
    for table, prefix, tasks in ((summary["table1"], "eval", 11), (summary["fresh"], "fresh", 33)):
        for side in ("warm", "trained"):
            con = duckdb.connect(str(out / f"{prefix}-{side}" / "results.duckdb"), read_only=True)
            n, c = con.execute("SELECT count(*), sum(reward) FROM attempts WHERE status = 'ok'").fetchone()
            assert table[side]["pass@1"]["value"] == pytest.approx(c / n) and table[side]["tasks"] == tasks
        delta = table["compare"]["metrics"]["pass@1"]
        assert delta["delta"] == pytest.approx(table["trained"]["pass@1"]["value"] - table["warm"]["pass@1"]["value"])
    assert "## Fresh instances (generator seed 2027" in (out / "report/README.md").read_text()
    # the comparison: every run's figures read back from its files, on both splits, and each paired difference
    for split, prefix in (("held-out", "eval"), ("fresh", "fresh")):
        got = summary["comparison"][split]
        for run_name in ("warm", "trained", "rft", "sft"):
            con = duckdb.connect(str(out / f"{prefix}-{run_name}" / "results.duckdb"), read_only=True)
            p1, kk = con.execute("SELECT avg(r), avg(CASE WHEN r = 1 THEN 1.0 ELSE 0.0 END) FROM (SELECT task_id, "
                                 "avg(reward) AS r FROM attempts WHERE status = 'ok' GROUP BY 1)").fetchone()
            con.close()
            assert got["pass@1"][run_name] == pytest.approx(p1, abs=1e-6) and got["k/k"][run_name] == pytest.approx(kk, abs=1e-6)
        for a, b in (("warm", "trained"), ("warm", "rft"), ("rft", "trained"), ("sft", "trained")):
            d = got["pass@1"][f"{b}-{a}"]
            assert d["delta"] == pytest.approx(got["pass@1"][b] - got["pass@1"][a], abs=1e-6) and d["lo"] <= d["hi"]
    readme = (out / "report/README.md").read_text()
    assert "## GRPO against RFT, its start and oracle SFT" in readme and "| base | GRPO | RFT | oracle SFT |" in readme
    assert "needs demonstrations the checks do not give you" in readme


def test_rft_ran_through_the_trainer_on_grpos_pool_for_grpos_time(run):
    """RFT is `tbhpc train` with algorithm: rft: GRPO's config otherwise, its measured time as the
    budget, the same pool, and every update made of the episodes whose check passed."""
    from tbhpc.demo.baseline import grpo_seconds
    out, log = run
    grpo, rft = (yaml.safe_load((out / name / "config.yaml").read_text()) for name in ("train", "rft"))
    assert rft["algorithm"] == "rft" and grpo["algorithm"] == "grpo"
    assert rft["max_seconds"] == pytest.approx(grpo_seconds(out / "train"), abs=0.1)
    same = {k for k in grpo if k not in ("name", "algorithm", "max_seconds")}
    assert {k: rft[k] for k in same} == {k: grpo[k] for k in same}
    pool = set(yaml.safe_load((out / "pool.yaml").read_text())["tasks"])
    con = duckdb.connect(str(out / "rft/results.duckdb"), read_only=True)
    assert {t for (t,) in con.execute("SELECT DISTINCT task_id FROM attempts").fetchall()} <= pool
    steps = [json.loads(ln) for ln in (out / "rft/logs/train_steps.jsonl").read_text().splitlines()]
    passed = dict(con.execute("SELECT train_step, sum(reward) FROM attempts GROUP BY 1").fetchall())
    assert steps and all(s["loss_tokens"] > 0 for s in steps if passed.get(s["step"], 0) > 0)
    assert any((out / "rft/exports").glob("step-*/config.json"))


def test_the_export_loads_in_transformers_and_serves_in_vllm(run, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tbhpc.policy.generation import Sampling, ServerGenerator, recompute_logprobs
    out, _ = run
    export = out / "train/exports/step-000002"
    model, tok = AutoModelForCausalLM.from_pretrained(export), AutoTokenizer.from_pretrained(export)
    warm = AutoModelForCausalLM.from_pretrained(WARM)
    assert max(float((a - b).detach().abs().max()) for a, b in zip(model.parameters(), warm.parameters())) > 0
    prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": "Please cancel order O2021."}], tokenize=False,
                                                add_generation_prompt=True), add_special_tokens=False)
    with torch.no_grad():
        assert model.generate(torch.tensor([prompt]), max_new_tokens=4, do_sample=False).shape[1] == len(prompt) + 4
    if not Path(default_vllm_python()).exists():
        if os.environ.get("TBHPC_REQUIRE_VLLM"):
            pytest.fail(f"TBHPC_REQUIRE_VLLM is set but {default_vllm_python()} does not exist (make env-vllm)")
        pytest.skip("no vLLM environment (run `make env-vllm`)")
    from test_vllm import EAGER, SERVE_OPTS, _wait_endpoint
    proc = subprocess.Popen([sys.executable, "-m", "tbhpc.cli", "serve", str(tmp_path / "serve"), f"model={export}",
                             *SERVE_OPTS, "cpu_threads=1", "dtype=float32", EAGER], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        ep = _wait_endpoint(tmp_path / "serve", lambda: proc.poll() is None)
        got = ServerGenerator(ep.base_url, ep.model, token=ep.client().token).generate(prompt, Sampling(max_tokens=12), seed=1)
        exact = recompute_logprobs(model, prompt + got.token_ids, len(prompt))
        assert got.token_ids and np.abs(np.array(exact) - got.logprobs).max() < 1e-3, cpu_class()
    finally:
        proc.terminate()
        proc.wait(timeout=60)
