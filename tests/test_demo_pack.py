"""The demo pack (tbhpc/data/packs/demo): sizes, instance-disjoint splits, byte-identical
regeneration, fresh instances by seed, and the ceiling of every constant behaviour per template."""
import collections
import filecmp
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tbhpc.domains import DEMO_DOMAIN_NAMES, catalogs, get_domain
from tbhpc.demo.pack_checks import constant_ceilings
from tbhpc.domains.demo.pack import DEMO_SEED, TRAIN_PER_TEMPLATE, demo_instances, fingerprint
from tbhpc.tasks.loader import default_pack_dir, load_exclusions, load_pack, validate_tasks

REPO = Path(__file__).resolve().parents[1]

PACK = default_pack_dir().parent / "demo"


def tbhpc(*args):
    proc = subprocess.run([sys.executable, "-m", "tbhpc.cli", *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.fixture(scope="module")
def demo_tasks():
    return load_pack(PACK)


@pytest.fixture(scope="module")
def instances():
    return demo_instances()


def test_sizes_tools_and_validation(demo_tasks):
    per_split = collections.Counter(t.split for t in demo_tasks)
    assert per_split["train"] >= 4000 and per_split["eval"] >= 100, per_split
    assert {t.domain for t in demo_tasks} == set(DEMO_DOMAIN_NAMES)
    for name in DEMO_DOMAIN_NAMES:
        d = get_domain(name)
        assert len(d.tools) <= 6 and "transfer" in d.tools, name
        assert not d.scenario.manual and d.scenario.agent_prompt, name   # the rules are in the prompt
    templates = collections.Counter((t.domain, t.template) for t in demo_tasks if t.split == "train")
    assert len(templates) >= 10 and set(templates.values()) == {TRAIN_PER_TEMPLATE}
    validate_tasks(demo_tasks, catalogs(DEMO_DOMAIN_NAMES))
    assert tbhpc("tasks", "validate", str(PACK)).startswith("OK: ")


def test_splits_are_disjoint_by_id_instance_and_content(demo_tasks, instances):
    train = {t.id for t in demo_tasks if t.split == "train"}
    evals = {t.id for t in demo_tasks if t.split == "eval"}
    assert not train & evals
    assert load_exclusions(PACK / "eval_ids.txt") == evals
    by_split = collections.defaultdict(set)
    for inst in instances:
        by_split[inst.task.split].add(fingerprint(inst.case))
    assert not by_split["train"] & by_split["eval"]
    assert len(by_split["eval"]) == len(evals)          # no eval instance repeats another either


def test_regeneration_is_byte_identical(tmp_path: Path):
    out = tbhpc("tasks", "generate", "--pack", "demo", "--out", str(tmp_path / "again"))
    assert "wrote" in out
    names = sorted(p.name for p in PACK.iterdir())
    match, mismatch, errors = filecmp.cmpfiles(PACK, tmp_path / "again", names, shallow=False)
    assert match == names, (mismatch, errors)


def test_a_seed_writes_fresh_instances_of_the_same_templates(tmp_path: Path, demo_tasks, instances):
    tbhpc("tasks", "generate", "--pack", "demo", "--seed", "11", "--out", str(tmp_path / "s11"))
    fresh = load_pack(tmp_path / "s11")
    assert len(fresh) == len(demo_tasks)
    assert {(t.domain, t.template, t.split) for t in fresh} == {(t.domain, t.template, t.split) for t in demo_tasks}
    assert all("-s11-" in t.id for t in fresh) and not {t.id for t in fresh} & {t.id for t in demo_tasks}
    bundled = {fingerprint(i.case) for i in instances}
    again = {fingerprint(i.case) for i in demo_instances(seed=11)}
    assert len(again & bundled) < 0.01 * len(again)       # ids are drawn from 9,000 per letter prefix
    assert tbhpc("tasks", "validate", str(tmp_path / "s11")).startswith("OK: ")
    tbhpc("tasks", "generate", "--pack", "demo", "--seed", "11", "--out", str(tmp_path / "s11b"))
    assert (tmp_path / "s11" / "demo_retail.yaml").read_bytes() == (tmp_path / "s11b" / "demo_retail.yaml").read_bytes()
    assert DEMO_SEED != 11


def test_the_fresh_pack_size_is_a_field_and_a_template_s_first_instances_do_not_depend_on_it(tmp_path: Path):
    from tbhpc.demo.config import DemoConfig
    from tbhpc.demo.pipeline import fresh_pack
    from tbhpc.errors import UserError
    small = load_pack(fresh_pack(DemoConfig(fresh_seed=5, fresh_per_template=2), tmp_path))
    large = load_pack(fresh_pack(DemoConfig(fresh_seed=5, fresh_per_template=3), tmp_path))
    templates = {(t.domain, t.template) for t in large}
    assert len(small) == 2 * len(templates) and len(large) == 3 * len(templates)
    assert {t.id: t.query for t in small}.items() <= {t.id: t.query for t in large}.items()
    assert all(t.split == "eval" for t in large)
    with pytest.raises(UserError, match="fresh_per_template"):
        DemoConfig(fresh_seed=5, fresh_per_template=0)


def test_no_constant_behaviour_passes_more_than_about_half_of_a_template(instances):
    """Each branch played on every train instance, hedges (act, then a refusal's message),
    transfer and doing nothing: graded by the real engine, per template."""
    ceilings = constant_ceilings([i for i in instances if i.task.split == "train"])
    print(json.dumps({k: {b: round(r, 3) for b, r in v.items()} for k, v in ceilings.items()}, indent=1))
    assert len(ceilings) >= 10
    for template, rates in ceilings.items():
        assert rates["noop"] == 0.0, template
        assert max(rates.values()) <= 0.56, (template, rates)
        branches = [b for b in rates if "+" not in b and b not in ("noop", "transfer")]
        assert len(branches) >= 2, template


def test_every_golden_trajectory_passes_and_the_branch_tag_names_it(demo_tasks):
    from tbhpc.env.episode import run_episode
    from tbhpc.env.judge import KeywordJudge
    from tbhpc.env.users import ScriptedUser
    from tbhpc.policy.scripted import OraclePolicy
    sample = demo_tasks[::37]
    for t in sample:
        r = run_episode(t, get_domain(t.domain), OraclePolicy(), ScriptedUser(), KeywordJudge())
        assert r.passed, (t.id, r.grade)
        assert sum(x.startswith("branch:") for x in t.tags) == 1


def test_the_demo_pack_is_named_and_the_demo_config_checks_its_fields(demo_tasks):
    from tbhpc.demo.config import DemoConfig
    from tbhpc.errors import UserError
    assert [t.id for t in load_pack("demo")] == [t.id for t in demo_tasks]
    assert tbhpc("tasks", "validate", "demo").startswith("OK: 4510 tasks")
    assert DemoConfig().warm_path == "models/demo-pack-warm" and DemoConfig(pack="full").warm_path == "models/demo-warm"
    assert DemoConfig(start="plateau").warm_path == "models/demo-pack-plateau"
    with pytest.raises(UserError, match="fresh_seed"):
        DemoConfig(pack="full", fresh_seed=3)
    with pytest.raises(UserError, match="'start' other than base needs model: tiny and pack: demo"):
        DemoConfig(pack="full", start="plateau")
    with pytest.raises(UserError, match="'start' must be one of base, plateau"):
        DemoConfig(start="sft")
    for bad in (["ppo"], ["rft", "rft"]):
        with pytest.raises(UserError, match="'baselines' takes each of rft, sft at most once"):
            DemoConfig(baselines=bad)


def test_the_warm_start_gate_wants_the_band_and_no_type_at_0_or_100():
    from tbhpc.train.warm_select import in_band
    ok = {"pass_at_1": 0.6, "per_type": {"a/x": 0.3, "b/y": 0.9}}
    assert in_band(ok, 0.5, 0.85)
    assert not in_band({**ok, "pass_at_1": 0.45}, 0.5, 0.85) and not in_band({**ok, "pass_at_1": 0.9}, 0.5, 0.85)
    assert not in_band({**ok, "per_type": {"a/x": 0.0, "b/y": 0.9}}, 0.5, 0.85)
    assert not in_band({**ok, "per_type": {"a/x": 1.0, "b/y": 0.5}}, 0.5, 0.85)
    assert not in_band({"pass_at_1": 0.6, "per_type": {}}, 0.5, 0.85)


def _gate_stand_ins():
    """A one-weight model and a tokenizer that save nothing: what the gate handles, without a campaign."""
    import torch

    class Model(torch.nn.Linear):
        def save_pretrained(self, path):
            pass

    class Tok:
        def save_pretrained(self, path):
            pass
    return Model, Tok


def test_the_gate_stops_a_first_phase_in_the_band_and_keeps_a_polish_phases_best_checkpoint(monkeypatch, tmp_path):
    # The selection logic only: the evaluation is replaced by scripted figures (the real one runs
    # campaigns of the warm start; `make warmstart-demo` is that path end to end).
    import torch

    from tbhpc.train import warm_select
    from tbhpc.train.warm_select import SelectGate
    Model, Tok = _gate_stand_ins()

    figures = iter([(0.30, 0.5), (0.60, 0.5),                     # "first": out of the band, then in it
                    (0.70, 0.5), (0.65, 0.5), (0.90, 0.5), (0.72, 1.0)])   # "best": the 0.70 one stays chosen
    monkeypatch.setattr(warm_select, "evaluate", lambda *a: (lambda p, t: {"pass_at_1": p, "per_type": {"a/x": t, "b/y": 0.5}})(*next(figures)))
    gate, model, tok = SelectGate(str(tmp_path), every=1, log=lambda m: None), Model(1, 1, bias=False), Tok()
    decisions = []
    for step, mode in enumerate(["first", "first", "best", "best", "best", "best"], 1):
        with torch.no_grad():
            model.weight.fill_(step)
        decisions.append(gate(step, model, tok, mode))
    assert decisions == [False, True, False, False, False, True]    # patience 3 ends the polish phase
    assert gate.chosen["step"] == 3 and gate.chosen["pass_at_1"] == 0.70
    gate.restore(model)
    assert model.weight.item() == 3.0                                # the chosen weights, not the last
    gate.write(tmp_path)
    doc = json.loads((tmp_path / "selection.json").read_text())
    assert doc["chosen"]["step"] == 3 and [r["phase_gate"] for r in doc["history"]][:3] == ["first", "first", "best"]
    assert "_state" not in doc["gate"] and doc["gate"]["patience"] == 3


def test_a_plateau_phase_keeps_the_best_checkpoint_and_ends_once_pass_at_1_stops_rising(monkeypatch, tmp_path):
    # The selection logic only, as above: scripted figures instead of campaigns.
    import torch

    from tbhpc.train import warm_select
    from tbhpc.train.warm_select import SelectGate
    Model, Tok = _gate_stand_ins()

    # every type at 1.0 would be out of any band: a plateau does not care (the pool's selection drops easy tasks)
    figures = iter([0.60, 0.70, 0.80, 0.803, 0.79, 0.81, 0.70, 0.75, 0.78, 0.99])
    monkeypatch.setattr(warm_select, "evaluate", lambda *a: {"pass_at_1": next(figures), "per_type": {"a/x": 1.0}})
    gate = SelectGate(str(tmp_path), every=1, patience=3, min_delta=0.005, log=lambda m: None)
    model, tok = Model(1, 1, bias=False), Tok()
    decisions = []
    for step in range(10):
        with torch.no_grad():
            model.weight.fill_(step)
        decisions.append(gate(step, model, tok, "plateau"))
        if decisions[-1]:
            break
    # 0.803 and 0.79 do not beat 0.80 by 0.005; 0.81 does (patience restarts); then three evaluations without
    assert decisions == [False] * 8 + [True]
    assert gate.chosen["step"] == 5 and gate.chosen["pass_at_1"] == 0.81
    gate.restore(model)
    assert model.weight.item() == 5.0
    gate.write(tmp_path)
    doc = json.loads((tmp_path / "selection.json").read_text())
    assert [r["step"] for r in doc["history"]] == list(range(9)) and doc["gate"]["min_delta"] == 0.005
    assert all("seconds" in r for r in doc["history"])


def test_candidate_instances_avoid_every_instance_of_the_bundled_pack(tmp_path: Path, instances):
    """The demo's probe candidates (candidates_seed): train instances of another seed, none equal to
    an instance (train or eval) of the bundled pack, which the SFT plateau learnt; written once."""
    from tbhpc.demo.config import DemoConfig
    from tbhpc.demo.pipeline import train_pack, write_candidates
    from tbhpc.errors import UserError
    bundled = {fingerprint(i.case) for i in instances}
    plain = demo_instances(seed=11, train=TRAIN_PER_TEMPLATE, eval=0)
    avoided = demo_instances(seed=11, train=TRAIN_PER_TEMPLATE, eval=0, avoid_seed=DEMO_SEED)
    assert {fingerprint(i.case) for i in plain} & bundled                 # without it, seed 11 repeats 4 of 4,400
    assert not {fingerprint(i.case) for i in avoided} & bundled and len(avoided) == len(plain)
    cfg = DemoConfig(out=str(tmp_path / "demo"), candidates_seed=11, candidates_per_template=3)
    path = write_candidates(cfg)
    assert train_pack(cfg) == str(path) and train_pack(DemoConfig()) == "demo"
    tasks = load_pack(path)
    assert len(tasks) == 33 and {t.split for t in tasks} == {"train"} and all("-s11-train" in t.id for t in tasks)
    first = (path / "demo_retail.yaml").read_bytes()
    assert write_candidates(cfg) == path and (path / "demo_retail.yaml").read_bytes() == first
    with pytest.raises(UserError, match="candidates_seed"):
        DemoConfig(pack="full", candidates_seed=11)


def test_make_demo_runs_the_base_experiment_and_start_plateau_the_plateau_one():
    """`make demo` is the published experiment (the base, RFT and oracle SFT beside GRPO); `make demo
    START=plateau` the plateau one; both configs load as the demo loads them and name committed starts."""
    from tbhpc.config import load_config
    from tbhpc.demo.config import DemoConfig
    for start, config in (("base", "jobs/demo-pack.yaml"), ("plateau", "jobs/demo-pack-plateau.yaml")):
        make = subprocess.run(["make", "-n", "demo", f"START={start}"], cwd=REPO, capture_output=True, text=True, check=True)
        assert f"--config {config} " in make.stdout, make.stdout
        cfg = load_config(DemoConfig, REPO / config, [])
        assert cfg.start == start and (REPO / cfg.warm_path / "config.json").exists()
        assert cfg.baselines == (["rft", "sft"] if start == "base" else ["sft"])
        assert cfg.train["max_seconds"] > 0 and cfg.candidates_seed is not None
