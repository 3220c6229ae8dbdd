"""Policy options and `key=value` overrides checked before anything is written: a typo is one line
naming the field, and the corrected command then runs (nothing half-created to refuse it)."""
import subprocess
import sys
from pathlib import Path

import pytest

from tbhpc.errors import UserError
from tbhpc.policy import check_policy_options, make_policy

CLI = [sys.executable, "-m", "tbhpc.cli"]


def _run(args, timeout=120):
    return subprocess.run(CLI + args, capture_output=True, text=True, timeout=timeout)


def _one_line(r, *needles):
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    for n in needles:
        assert n in r.stderr, r.stderr


@pytest.mark.parametrize("override, needles", [
    ("policy_opts={skil: 0.7}", ("policy_opts", "unknown field 'skil'", "skill")),
    ("policy_opts={skill: high}", ("policy_opts", "'skill'", "expected float, got str")),
    ("policy_opts={skill: 0.7", ("policy_opts={skill: 0.7", "malformed YAML value")),
    ("policy_opts=[0.7]", ("policy_opts", "expected dict")),
])
def test_a_campaign_with_bad_policy_options_creates_nothing_and_the_fix_runs(tmp_path: Path, override, needles):
    out = tmp_path / "run"
    _one_line(_run(["eval", "--out", str(out), "limit=2", "repeats=1", override]), *needles)
    assert not out.exists()
    fixed = _run(["eval", "--out", str(out), "limit=2", "repeats=1", "workers=1", "policy_opts={skill: 0.7}"], timeout=300)
    assert fixed.returncode == 0, fixed.stderr


def test_episode_options_are_checked_the_same_way():
    _one_line(_run(["episode", "--task", "retail-order_status-000", "--opt", "skil=0.7"]), "unknown field 'skil'")
    _one_line(_run(["episode", "--task", "retail-order_status-000", "--opt", "skill={"]), "--opt", "malformed YAML value")


def test_options_are_checked_without_building_the_policy():
    # an endpoint that does not exist would fail in the openai policy's constructor: the check never builds it
    assert check_policy_options("openai", {"endpoint": "/nowhere", "timeout_s": 5}) == {"endpoint": "/nowhere", "timeout_s": 5}
    with pytest.raises(UserError, match="unknown field 'temprature'"):
        check_policy_options("tokens", {"temprature": 1.0})
    with pytest.raises(UserError, match="noop policy.*unknown field 'skill'"):
        make_policy("noop", skill=0.5)
    with pytest.raises(UserError, match="unknown policy 'orcale'"):
        check_policy_options("orcale", {})


@pytest.mark.parametrize("args, needles", [
    (["limit=-2"], ("'limit'", "-2")),
    (["--workers", "0"], ("--workers", "got 0")),
    (["policy_opts={skill: .nan}"], ("'skill'", "nan")),
    (["policy_opts={skill: 5}"], ("'skill'", "within [0, 1]")),
    (["policy_opts={skill: -1}"], ("'skill'",)),
    (["policy_opts={delay_s: .inf}"], ("'delay_s'",)),
])
def test_campaign_values_out_of_range_create_nothing(tmp_path: Path, args, needles):
    out = tmp_path / "run"
    _one_line(_run(["eval", "--out", str(out), "repeats=1", *args]), *needles)
    assert not out.exists()


@pytest.mark.parametrize("override, needles", [
    ("temperature=-1", ("'temperature'", "-1")), ("top_p=5", ("'top_p'",)), ("top_k=-3", ("'top_k'",)),
    ("lr=.nan", ("'lr'", "nan")), ("betas=[0.9, 2]", ("'betas'",)), ("grad_clip=0", ("'grad_clip'",)),
    ("max_draws=1", ("'max_draws'",)),
])
def test_train_values_out_of_range_are_refused_before_the_model_loads(tmp_path: Path, override, needles):
    from tbhpc.config import load_config
    from tbhpc.train.config import TrainConfig
    with pytest.raises(UserError) as err:
        load_config(TrainConfig, None, ["groups_per_step=4", override])
    assert all(n in str(err.value) for n in needles) and "\n" not in str(err.value)


def test_the_demo_checks_its_train_section_before_the_first_stage(tmp_path: Path):
    out = tmp_path / "demo"
    _one_line(_run(["demo", f"out={out}", "train.stpes=3"]), "train.stpes", "unknown field 'stpes'")
    _one_line(_run(["demo", f"out={out}", "train.lr=-1"]), "'lr'")
    assert not out.exists()


@pytest.mark.parametrize("override, needles", [
    ("export_eval_overrides=[limt=50]", ("export_eval_overrides", "unknown field 'limt'")),
    ("export_eval_overrides=[repeats=many]", ("'repeats'", "expected int")),
    ("export_eval=jobs/nope.yaml", ("jobs/nope.yaml", "cannot read")),
    ("export_eval=jobs/probe.yaml", ("kind: probe",)),
])
def test_the_eval_of_every_export_is_read_when_the_train_command_is(tmp_path: Path, override, needles):
    # the export evals run detached, after each export: a typo there would be one log line per export
    run = tmp_path / "run"
    _one_line(_run(["train", str(run), "--config", "jobs/train.yaml", "pool=jobs/pools/smoke.yaml",
                    "export_eval=jobs/eval.yaml", override]), *needles)
    assert not run.exists()


def _typo(name: str) -> str:
    """A field's name with two inner letters swapped (a typo a person makes)."""
    i = next(i for i in range(1, len(name) - 2) if name[i] != name[i + 1] and "_" not in name[i:i + 2])
    return name[:i] + name[i + 1] + name[i] + name[i + 2:]


def test_a_misspelt_field_of_every_config_kind_is_one_short_line_naming_the_closest_fields():
    """Every config kind `tbhpc fields` knows, its sections (`slurm:`, `openenv:`) and the policy
    options: a typo of each of its fields answers in one line of at most 300 characters that names
    the field meant and where every field is listed, never the whole list."""
    from tbhpc.config import checked_values, load_config
    from tbhpc.fielddoc import KINDS, config_class, config_rows
    checked = 0
    for kind in KINDS:
        cls = config_class(kind)
        for field, *_ in config_rows(cls):
            if len(field) < 5:
                continue
            typo = _typo(field)
            with pytest.raises(UserError) as err:
                checked_values(cls, {typo: 1}, {typo: f"jobs/some/{kind}.yaml"})
            line = str(err.value)
            assert "\n" not in line and len(line) <= 300, line
            assert line.startswith(f"jobs/some/{kind}.yaml: unknown field {typo!r}; did you mean ") and repr(field) in line, line
            assert line.endswith(f"(every field: tbhpc fields {kind})"), line
            checked += 1
    assert checked > 150
    # the sections, through the overrides a person types
    with pytest.raises(UserError, match=r"unknown field 'cpus_per_tsk'; did you mean 'cpus_per_task'.*tbhpc fields slurm\)$"):
        load_config(config_class("train"), "jobs/train.yaml", ["slurm.cpus_per_tsk=2"])
    with pytest.raises(UserError, match=r"unknown field 'tiemout_s'; did you mean 'timeout_s'.*tbhpc fields openenv\)$"):
        load_config(config_class("campaign"), None, ["environment=openenv", "openenv={url: 'http://h:1', tiemout_s: 3}"])
    with pytest.raises(UserError, match=r"policy_opts \(tokens policy\): unknown field 'temprature'; did you mean "
                                        r"'temperature'\? \(every field: tbhpc fields policy:tokens\)$"):
        check_policy_options("tokens", {"temprature": 1.0})
    # nothing close: said so, still one line; a very long origin is cut from the left, never the hint
    with pytest.raises(UserError) as err:
        checked_values(config_class("train"), {"zzzzzzzz": 1}, {"zzzzzzzz": "/" + "x" * 400 + "/train.yaml"})
    line = str(err.value)
    assert len(line) == 300 and line.startswith("...") and "not close to any of the" in line, line
    assert line.endswith("(every field: tbhpc fields train)")


def test_the_demo_answers_a_typo_in_its_train_section_in_one_line():
    r = _run(["demo", "--config", "jobs/demo.yaml", "train.lrr=1e-4"])
    _one_line(r, "unknown field 'lrr'; did you mean 'lr'?", "tbhpc fields train")
    assert len(r.stderr.strip()) <= 300, r.stderr


def test_tbhpc_fields_lists_every_field_with_its_meaning():
    from tbhpc.cli.fields import render, rows_for
    from tbhpc.fielddoc import config_class
    r = _run(["fields", "train"])
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    names = [f.name for f in __import__("dataclasses").fields(config_class("train")) if not f.name.startswith("_")]
    assert [ln.split()[0] for ln in lines] == names
    lr = next(ln for ln in lines if ln.startswith("lr "))
    assert "default 1e-06" in lr and "#" in lr, lr
    assert render("x", [("a", "int", "`1`", "one"), ("bbb", "str or None", "`None`", "")]) == (
        "a    int          default 1  # one\nbbb  str or None  default None\n")
    assert {o for o, *_ in rows_for("policy:tokens")} >= {"temperature", "model_path"}
    _one_line(_run(["fields", "slrum"]), "unknown kind 'slrum'", "did you mean 'slurm'")
