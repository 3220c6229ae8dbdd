"""A ThinkingBox checkout used "as it is", the way a new user meets it (issue 28), on a fixture
checkout the tests build (tests/tb_release_fixture.py): files tbhpc cannot grade beside the
release's, rubric tasks without keywords, and a server package with the real one's two traps
(an unpinned framework whose newest major removed a module, seed data left out of a plain
install). Each case: the exit status and the exact one-line message. The server package is
installed into real virtual environments with pip (offline: the fixture's wheels), following
the recipe of docs/guides/thinkingbox.md, and run as real MCP server processes."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
import yaml

from tb_release_fixture import RELEASE, build_checkout

pytestmark = pytest.mark.slow


def tbhpc(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tbhpc.cli", *args], capture_output=True, text=True, timeout=300, cwd=cwd)


def install(root: Path, venv: Path, *pip_args: str) -> Path:
    """The recipe of docs/guides/thinkingbox.md (a venv of its own, pip install, a servers file naming its python), with
    --no-index --find-links added only because the fixture's framework wheels are local files."""
    subprocess.run(["python3", "-m", "venv", str(venv)], check=True, timeout=120)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--no-index", "--find-links", str(root / "wheels"),
                    *pip_args], check=True, timeout=300, capture_output=True)
    servers = venv.parent / f"{venv.name}.yaml"
    servers.write_text(f"python: {venv}/bin/python\n" + (root / "servers" / "servers.yaml").read_text())
    return servers


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    return build_checkout(tmp_path_factory.mktemp("tb-data"))


@pytest.fixture(scope="module")
def good_servers(checkout, tmp_path_factory) -> Path:
    """Installed as docs/guides/thinkingbox.md says: editable, with the framework's working major pinned."""
    pkg = checkout / "servers" / "shop_servers"
    return install(checkout, tmp_path_factory.mktemp("envs") / "tb-servers", "-e", str(pkg), "fixmcp>=3,<4")


SKIPPED = ("tbhpc: skipped tau_port.py: task test_book: line 12: the test body has a statement of type Assign; "
           "tbhpc never runs test files and grades only validate_database and validate_rubrics_yesno")


def test_validate_skips_the_files_it_cannot_grade_says_why_and_strict_refuses_them(checkout):
    res = tbhpc("tasks", "validate", f"tb:{checkout}")
    assert res.returncode == 0, res.stderr
    assert res.stderr.splitlines() == [SKIPPED]
    assert res.stdout.splitlines() == [
        "OK: 3 tasks in 1 scenario(s); skipped 1 file(s) tbhpc cannot grade (above; --strict makes them errors) "
        "(servers not checked: --servers FILE)",
        "note: 1 task(s) have yes/no rubrics without keywords: run them with an LLM judge (judge=openai "
        "judge_url=URL) or rubrics=skip"]
    listed = tbhpc("tasks", "list", f"tb:{checkout}", "--format", "json")
    assert [t["id"] for t in json.loads(listed.stdout)] == sorted(RELEASE)
    strict = tbhpc("tasks", "validate", f"tb:{checkout}", "--strict")
    tau = checkout / "dataset" / "test_case" / "tau_port.py"
    assert (strict.returncode, strict.stdout) == (2, "")
    assert strict.stderr == (f"tbhpc: error: {tau}: task test_book: line 12: the test body has a statement of type "
                             "Assign; tbhpc never runs test files and grades only validate_database and "
                             "validate_rubrics_yesno\n")


def test_a_test_list_naming_a_task_in_a_skipped_file_names_both(checkout, tmp_path):
    ids = tmp_path / "list.yaml"
    ids.write_text(yaml.safe_dump(RELEASE + ["tau_port.py:test_book"]))
    res = tbhpc("tasks", "validate", f"tb:{checkout}", "--tasks", str(ids))
    tau = checkout / "dataset" / "test_case" / "tau_port.py"
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr == (f"tbhpc: error: task tau_port.py:test_book is in a file tbhpc cannot grade (it never runs "
                          f"test files): {tau}: task test_book: line 12: the test body has a statement of type Assign; "
                          "tbhpc never runs test files and grades only validate_database and validate_rubrics_yesno\n")
    release = tbhpc("tasks", "validate", f"tb:{checkout}", "--tasks", str(checkout / "releases/shop_v1/testlist.yaml"))
    assert release.returncode == 0 and release.stderr == "" and release.stdout.startswith("OK: 3 tasks in 1 scenario(s)")


def test_an_unpinned_framework_is_caught_before_planning_with_the_servers_exit_status(checkout, tmp_path):
    servers = install(checkout, tmp_path / "unpinned", "-e", str(checkout / "servers" / "shop_servers"))
    res = tbhpc("tasks", "validate", f"tb:{checkout}", "--servers", str(servers))
    assert res.returncode == 2 and res.stdout == ""
    line = res.stderr.splitlines()[-1]
    assert line.startswith(f"tbhpc: error: {servers}: servers check failed for scenario shop_support (task "
                           "shop_support_group1.py:test_cancel_001): tool server shop: exited with status 1 before it "
                           "was ready (stderr: ")
    assert line.endswith("| ModuleNotFoundError: No module named 'fixmcp.server.tasks')")


def test_seed_data_left_out_of_a_plain_install_is_caught_by_a_real_init(checkout, tmp_path):
    servers = install(checkout, tmp_path / "plain", str(checkout / "servers" / "shop_servers"), "fixmcp>=3,<4")
    run = tmp_path / "runs" / "eval"
    res = tbhpc("eval", "--out", str(run), f"pack=tb:{checkout}", f"servers={servers}",
                f"tasks={checkout / 'releases/shop_v1/testlist.yaml'}", "rubrics=skip")
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.splitlines()[-1] == (
        f"tbhpc: error: {servers}: servers check failed for scenario shop_support (task shop_support_group1.py:"
        "test_cancel_001): tool server shop: __reserved__init did not return {}: {\"error\": \"Unknown table "
        "'shop_orders'\"}")
    assert not run.exists()                     # nothing planned, nothing written


def test_rubrics_the_judge_cannot_answer_are_refused_up_front_or_skipped_and_recorded(checkout, good_servers, tmp_path):
    release = checkout / "releases/shop_v1/testlist.yaml"
    run = tmp_path / "eval"
    args = ("eval", "--out", str(run), f"pack=tb:{checkout}", f"servers={good_servers}", f"tasks={release}")
    refused = tbhpc(*args)
    assert (refused.returncode, refused.stdout) == (2, "")
    assert refused.stderr == (
        "tbhpc: error: 1 task(s) carry yes/no rubrics the keyword judge cannot answer (no keywords; first: "
        "shop_support_group1_rubrics_yesno.py:test_cancel_rubric_001): give an LLM judge (judge=openai "
        "judge_url=URL), a task list without them, or rubrics=skip (graded on the database only; attempts record "
        "rubrics_skipped)\n")
    assert not run.exists()
    done = tbhpc(*args, "rubrics=skip")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == f"{run}: 3 planned, 0 already done, 3 executed (3 ok, 0 system errors), 0 still to run"
    assert ("note: 1 attempt(s) of 1 task(s) were graded without their yes/no rubrics (rubrics=skip: a pass means the "
            "database matched; attempts.rubrics_skipped)") in " ".join(done.stderr.split())
    con = duckdb.connect(str(run / "results.duckdb"), read_only=True)
    rows = con.execute("SELECT task_id, passed, rubrics_skipped FROM attempts ORDER BY task_id").fetchall()
    assert rows == [("shop_support_group1.py:test_cancel_001", True, None),
                    ("shop_support_group1.py:test_lookup_002", True, None),
                    ("shop_support_group1_rubrics_yesno.py:test_cancel_rubric_001", True, 1)]
    # a resume of another campaign is refused before any server starts (servers that could not start
    # would otherwise be the error)
    text = good_servers.read_text()
    good_servers.write_text(text.replace("python: ", "python: /nonexistent"))
    try:
        again = tbhpc(*args, "rubrics=skip", "policy=noop")
    finally:
        good_servers.write_text(text)
    assert again.returncode == 2
    assert again.stderr == (f"tbhpc: error: {run}: holds a different campaign (field 'policy' differs); "
                            "use a new --out directory\n")


def test_the_readme_recipe_validates_and_a_noop_agent_fails_the_release(checkout, good_servers, tmp_path):
    res = tbhpc("tasks", "validate", f"tb:{checkout}", "--servers", str(good_servers),
                "--tasks", str(checkout / "releases/shop_v1/testlist.yaml"))
    assert res.returncode == 0 and res.stdout.startswith("OK: 3 tasks in 1 scenario(s)\n"), res.stderr
    run = tmp_path / "noop"
    done = tbhpc("eval", "--out", str(run), f"pack=tb:{checkout}", f"servers={good_servers}", "policy=noop",
                 f"tasks={checkout / 'releases/shop_v1/testlist.yaml'}", "rubrics=skip")
    assert done.returncode == 0, done.stderr
    con = duckdb.connect(str(run / "results.duckdb"), read_only=True)
    # doing nothing changes nothing: the read-only task passes, the two cancellations fail on the database
    assert con.execute("SELECT task_id, passed FROM attempts ORDER BY task_id").fetchall() == [
        ("shop_support_group1.py:test_cancel_001", False), ("shop_support_group1.py:test_lookup_002", True),
        ("shop_support_group1_rubrics_yesno.py:test_cancel_rubric_001", False)]


def test_auto_workers_leave_a_cpu_per_worker_for_servers_started_ahead(checkout, good_servers, tmp_path):
    from tbhpc.campaign.config import auto_workers
    from tbhpc.tb.dataset import TBDataset
    tasks = TBDataset(checkout).tasks(RELEASE)
    assert auto_workers(tasks, str(good_servers), cpus=2) == (
        1, "MCP servers started fresh for each attempt, 2 CPU(s): one worker per two")
    assert auto_workers(tasks, str(good_servers), cpus=16)[0] == 8
    reused = tmp_path / "reused.yaml"
    doc = yaml.safe_load(good_servers.read_text())
    doc["servers"]["shop"]["reuse"] = True
    reused.write_text(yaml.safe_dump(doc))
    assert auto_workers(tasks, str(reused), cpus=2) == (2, "2 CPU(s): one worker each")
    assert auto_workers([], None, cpus=3) == (3, "3 CPU(s): one worker each")


def test_a_training_pool_with_rubrics_the_judge_cannot_answer_is_refused(checkout):
    from tbhpc.agents import check_judge
    from tbhpc.errors import UserError
    from tbhpc.tb.dataset import TBDataset
    tasks = TBDataset(checkout).tasks(RELEASE)
    with pytest.raises(UserError) as err:
        check_judge(tasks, "keyword", skip_field=False)       # what the trainer calls: no rubrics=skip for rewards
    assert str(err.value) == ("1 task(s) carry yes/no rubrics the keyword judge cannot answer (no keywords; first: "
                              "shop_support_group1_rubrics_yesno.py:test_cancel_rubric_001): give an LLM judge "
                              "(judge=openai judge_url=URL), a task list without them")
    check_judge(tasks, "openai")
    check_judge(tasks, "keyword", "skip")
    check_judge(tasks[:2], "keyword")
