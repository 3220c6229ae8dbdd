"""Trackers for real: a 3-step `tbhpc train` logging to trackio, Weights & Biases (offline),
MLflow (a sqlite store) and TensorBoard at once, each record read back with the tracker's own
reader and compared with results.duckdb's train_steps rows, number for number; the evals of two
exports at their steps; a table of sample transcripts; and, traced by strace, not one network
connection from any process of the run. Then the same trainer with its trackers failing mid-run
(a directory made read-only, a helper process killed, a server that never answers): the run
finishes, every step in DuckDB, one warning line per tracker.
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import psutil
import pytest

from helpers import step_scalars, tracker_env, trackio_record, wandb_records

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
TRACKERS = ["trackio", "wandb", "mlflow", "tensorboard"]
RUN = ["generator=local", "steps=3", "group_size=4", "groups_per_step=1", "max_draws=4", "max_tokens=48",
       "response_budget=160", "lr=1e-4", "microbatch_tokens=4096", "seed=3",
       "exclude=[tbhpc/data/packs/default/eval_ids.txt]"]
POOL = "tasks: [consulting-leave_balance-001, consulting-leave_balance-002]\n"
EVAL = ["export_every=2", "export_eval=jobs/eval.yaml",
        "export_eval_overrides=[tasks=jobs/pools/smoke.yaml, limit=1, repeats=2, workers=1]"]


@pytest.fixture(scope="module")
def tracked(warm_dir, tmp_path_factory):
    base = tmp_path_factory.mktemp("tracked")
    (base / "pool.yaml").write_text(POOL)
    run, trace = base / "run", base / "connect.trace"
    cmd = [sys.executable, "-m", "tbhpc.cli", "train", str(run), f"model={warm_dir}", f"pool={base / 'pool.yaml'}", *RUN,
           *EVAL, f"trackers=[{', '.join(TRACKERS)}]", "tracker_project=tracked", "tracker_tags=[ci, tiny]",
           "tracker_samples_every=2", "tracker_samples=2"]
    # every connect(2) of the trainer and of everything it starts (wandb's service, the detached evals)
    res = subprocess.run(["strace", "-f", "--seccomp-bpf", "-qq", "-s", "48", "-e", "trace=connect,sendto", "-o", str(trace),
                          *cmd],
                         cwd=REPO, env=tracker_env(), capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    deadline = time.monotonic() + 300                 # the evals run detached; their agg logs them
    while not all((run / "evals" / f"step-00000{s}" / "tracked.json").exists() for s in (2, 3)):
        assert time.monotonic() < deadline, [p.read_text()[-2000:] for p in (run / "logs").glob("eval-*.log")]
        time.sleep(1)
    while _tracees_alive(trace):                      # the evals' processes have exited: the trace is whole
        assert time.monotonic() < deadline
        time.sleep(0.5)
    return run, res.stdout + res.stderr, trace


def _tracees_alive(trace: Path) -> bool:
    return any(p.info["cmdline"] and str(trace) in " ".join(p.info["cmdline"])
               for p in psutil.process_iter(["cmdline"]))


def _eval_summary(run: Path, step: int) -> dict:
    out = subprocess.run([sys.executable, "-m", "tbhpc.cli", "agg", str(run / "evals" / f"step-{step:06d}"),
                          "--format", "json", "--no-track"], cwd=REPO, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)["summary"]


def _expected_evals(run: Path) -> dict[int, dict]:
    """Each export's eval, from `tbhpc agg` itself: the numbers a tracker must show at its step."""
    out = {}
    for step in (2, 3):
        s = _eval_summary(run, step)
        out[step] = {"eval/pass_at_1": s["pass@1"]["value"], "eval/k_of_k_tasks": s["k/k"]["count"],
                     "eval/tasks": s["tasks"],
                     **{f"eval/{d['domain']}/pass_at_1": d["pass_rate"] for d in s["by_domain"]["domains"]}}
    return out


def _split(records: list[tuple[int, dict]]) -> tuple[dict, dict]:
    """(train scalars by step, eval scalars by eval/step) from one tracker's records."""
    train, evals = {}, {}
    for step, values in records:
        if "eval/step" in values:
            evals.setdefault(int(values["eval/step"]), {}).update({k: v for k, v in values.items() if k.startswith("eval/")})
        else:
            train.setdefault(step, {}).update({k: v for k, v in values.items() if k.startswith("train/")})
    return train, evals


def _check(name: str, records: list[tuple[int, dict]], run: Path, approx: float = 0.0) -> None:
    train, evals = _split(records)
    want = step_scalars(run)
    assert sorted(train) == [1, 2, 3], (name, sorted(train))
    for step, values in want.items():
        assert set(train[step]) == set(values), (name, step, set(train[step]) ^ set(values))
        for k, v in values.items():
            assert train[step][k] == pytest.approx(v, rel=approx, abs=approx), (name, step, k)
    for step, values in _expected_evals(run).items():
        for k, v in values.items():
            assert evals[step][k] == pytest.approx(v, rel=approx, abs=approx), (name, step, k)


def test_trackio_holds_exactly_the_step_rows_and_the_evals(tracked):
    run, _, _ = tracked
    doc = trackio_record(run / "trackers" / "trackio", "tracked")
    assert doc["runs"] == ["run"] and doc["config"]["steps"] == 3
    _check("trackio", [(r["step"], r) for r in doc["logs"] if "samples" not in r], run)
    tables = [r for r in doc["logs"] if "samples" in r]
    assert [r["step"] for r in tables] == [2]
    _check_samples(run, [[v[c] for c in ("step", "task", "attempt", "reward", "transcript")]
                         for v in tables[0]["samples"]["_value"]])


def _check_samples(run: Path, rows: list[list]) -> None:
    """The table's transcripts are what `tbhpc show` prints for those attempts."""
    assert len(rows) == 2 and all(r[0] == 2 for r in rows)
    for step, task, attempt, reward, transcript in rows:
        shown = subprocess.run([sys.executable, "-m", "tbhpc.cli", "show", str(run), task, "--attempt", str(attempt),
                                "--policy", "step-000001"], cwd=REPO, capture_output=True, text=True, check=True).stdout
        assert transcript.rstrip() == shown.rstrip() and len(transcript) > 200, (task, attempt)


def test_wandb_offline_run_holds_exactly_the_step_rows_and_the_evals(tracked):
    run, out, _ = tracked
    assert "tracker wandb: offline (no W&B key" in out and "tbhpc tracker-sync" in out
    dirs = sorted(run.glob("trackers/wandb/offline-run-*")) + sorted(run.glob("evals/step-*/wandb/offline-run-*"))
    ids = {d.name.rsplit("-", 1)[1] for d in dirs}
    assert len(dirs) == 3 and len(ids) == 1, dirs     # the training run and two evals, one wandb run
    records, config = [], None
    for d in dirs:
        for rec in wandb_records(d):
            if rec["type"] == "history":
                item = rec["history"]["item"]
                records.append((item.get("_step"), item))
            elif rec["type"] == "run" and config is None:
                config = rec["run"]["config"]["update"]
                assert rec["run"]["tags"] == ["ci", "tiny"] and rec["run"]["project"] == "tracked"
    assert config["steps"] == 3
    _check("wandb", [r for r in records if not any(k == "samples" for k in r[1])], run)
    (table,) = list((dirs[0] / "files" / "media" / "table").glob("samples_2_*.table.json"))
    doc = json.loads(table.read_text())
    _check_samples(run, doc["data"])


def test_mlflow_store_holds_exactly_the_step_rows_and_the_evals(tracked):
    run, _, _ = tracked
    ids = json.loads((run / "trackers" / "mlflow.json").read_text())
    assert ids["uri"] == f"sqlite:///{run / 'trackers' / 'mlflow.db'}"
    code = ("import json, sys; from mlflow.tracking import MlflowClient; c = MlflowClient(sys.argv[1]); "
            "r = c.get_run(sys.argv[2]); "
            "hist = {k: [(m.step, m.value) for m in c.get_metric_history(sys.argv[2], k)] for k in r.data.metrics}; "
            "p = c.download_artifacts(sys.argv[2], 'samples/step-000002.json', sys.argv[3]); "
            "print(json.dumps({'hist': hist, 'params': r.data.params, 'status': r.info.status, 'name': r.info.run_name, "
            "'table': json.load(open(p))}))")
    res = subprocess.run([sys.executable, "-c", code, ids["uri"], ids["run_id"], str(run.parent)], env=tracker_env(),
                         capture_output=True, text=True, check=True)
    doc = json.loads(res.stdout.splitlines()[-1])
    assert doc["name"] == "run" and doc["status"] == "FINISHED" and doc["params"]["steps"] == "3"
    by_step: dict[int, dict] = {}
    for key, points in doc["hist"].items():
        for step, value in points:
            by_step.setdefault((step, key.startswith("eval/")), {})[key] = value
    _check("mlflow", [(s, v) for (s, _), v in sorted(by_step.items())], run)
    _check_samples(run, doc["table"]["data"])


def test_tensorboard_event_files_hold_the_step_rows_and_the_evals(tracked):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    run, _, _ = tracked
    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    by_step: dict[tuple[int, bool], dict] = {}
    for tag in acc.Tags()["scalars"]:
        for e in acc.Scalars(tag):
            by_step.setdefault((e.step, tag.startswith("eval/")), {})[tag] = e.value
    # event files keep float32; an eval's files are its own (TensorBoard reads a directory's every file)
    _check("tensorboard", [(s, v) for (s, _), v in sorted(by_step.items())], run, approx=1e-6)


def test_no_process_of_the_run_opened_a_network_connection(tracked):
    """strace -f saw every connect(2) and sendto(2): only local sockets (Unix, loopback). The one
    exception is not a tracker's: torch's c10d store names each peer it accepts with getnameinfo,
    and a peer at ::ffff:127.0.0.1 (the dual-stack form of 127.0.0.1) is not in /etc/hosts, so glibc
    asks the resolver for 1.0.0.127.in-addr.arpa (the same with no tracker); that query, and only
    that query, is allowed."""
    _, _, trace = tracked
    lines = trace.read_text().splitlines()
    connects = [line for line in lines if " connect(" in line and "AF_INET" in line]
    loopback = re.compile(r'inet_addr\("127\.|inet_pton\(AF_INET6, "(::1|::ffff:127\.)')
    resolver = [line for line in connects if "htons(53)" in line]
    assert len(connects) > 2 and [c for c in connects if not loopback.search(c) and c not in resolver] == []
    for i, line in enumerate(lines):            # what each lookup asked (its socket's next send): the PTR of 127.0.0.1
        if line in resolver:
            pid, fd = re.match(r"(\d+) +connect\((\d+),", line).groups()
            asked = next(q for q in lines[i + 1:] if re.match(rf"{pid} +sendto\({fd}, ", q))
            assert "\\003127\\7in-addr\\4arpa" in asked, asked


def test_tracker_sync_plans_each_upload_and_copies_the_mlflow_run(tracked, tmp_path):
    """From a login node: --dry-run says what each tracker would do; wandb without a key is one
    error line; the MLflow run copied into another store holds every metric's whole history."""
    run, _, _ = tracked
    dry = subprocess.run([sys.executable, "-m", "tbhpc.cli", "tracker-sync", str(run), "--dry-run"], cwd=REPO, env=tracker_env(),
                         capture_output=True, text=True, timeout=120)
    assert dry.returncode == 0, dry.stderr
    assert "would run: wandb: wandb sync of 3 offline records (run tracked/run)" in dry.stdout
    assert "--trackio-space USER/SPACE" in dry.stdout and "--mlflow-uri URI" in dry.stdout
    target = f"sqlite:///{tmp_path / 'server.db'}"
    res = subprocess.run([sys.executable, "-m", "tbhpc.cli", "tracker-sync", str(run), "--mlflow-uri", target],
                         cwd=tmp_path, env=tracker_env(), capture_output=True, text=True, timeout=300)
    assert res.returncode == 1, res.stdout + res.stderr      # wandb: no key here
    errors = [line for line in res.stdout.splitlines() if line.startswith("tbhpc: error:")]
    assert len(errors) == 1 and "wandb" in errors[0] and "wandb login" in errors[0], res.stdout
    new = re.search(r"mlflow: run (\w+) in ", res.stdout).group(1)
    ids = json.loads((run / "trackers" / "mlflow.json").read_text())
    code = ("import json, sys; from mlflow.tracking import MlflowClient as C; "
            "h = lambda c, r: {k: sorted((m.step, m.value) for m in c.get_metric_history(r, k)) for k in c.get_run(r).data.metrics}; "
            "print(json.dumps([h(C(sys.argv[1]), sys.argv[2]), h(C(sys.argv[3]), sys.argv[4]), "
            "C(sys.argv[3]).get_run(sys.argv[4]).info.run_name]))")
    out = subprocess.run([sys.executable, "-c", code, ids["uri"], ids["run_id"], target, new], env=tracker_env(),
                         capture_output=True, text=True, check=True).stdout
    src, dst, name = json.loads(out.splitlines()[-1])
    assert src == dst and name == "run" and len(src["train/loss"]) == 3
    assert (tmp_path / "mlflow-artifacts").is_dir() and not (tmp_path / "mlruns").exists()   # beside the store

def test_an_unknown_or_missing_tracker_is_refused_before_the_run_directory_exists(tmp_path, warm_dir):
    run = tmp_path / "run"
    res = subprocess.run([sys.executable, "-m", "tbhpc.cli", "train", str(run), f"model={warm_dir}", "trackers=[wandbb]"],
                         cwd=REPO, env=tracker_env(), capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and not run.exists(), res.stderr
    assert res.stderr.strip().count("\n") == 0 and "unknown tracker 'wandbb'; did you mean 'wandb'?" in res.stderr
    # an environment without the tracking extra (the OpenEnv server's: tbhpc without trackio)
    other = os.environ.get("TBHPC_OPENENV_PYTHON") or str(REPO / ".venv-openenv" / "bin" / "python")
    if not Path(other).exists():
        pytest.skip("no .venv-openenv (make env-openenv): no environment without trackio to try")
    res = subprocess.run([other, "-m", "tbhpc.cli", "train", str(run), f"model={warm_dir}", "trackers=[trackio]"],
                         cwd=REPO, env=tracker_env(), capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and not run.exists(), res.stderr
    assert "trackio is not installed here (pip install 'tbhpc[tracking]'" in res.stderr, res.stderr


def _wait_for_step_1(db: Path) -> None:
    """The tracker thread writes step 1 just after the console line: let it land first."""
    import sqlite3
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
            if con.execute("SELECT count(*) FROM metrics WHERE step = 1").fetchone()[0]:
                con.close()
                return
            con.close()
        except sqlite3.Error:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{db}: step 1 never written")


def test_trackers_failing_mid_run_cost_one_warning_each_and_no_step(warm_dir, tmp_path):
    """After step 1: trackio's directory becomes a read-only file system, wandb's service process is
    killed; MLflow's server accepts connections and never answers (tracker_timeout_s bounds the wait)."""
    (tmp_path / "pool.yaml").write_text(POOL)
    run = tmp_path / "run"
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    env = tracker_env(MLFLOW_TRACKING_URI=f"http://127.0.0.1:{silent.getsockname()[1]}", MLFLOW_HTTP_REQUEST_TIMEOUT="600")
    cmd = [sys.executable, "-m", "tbhpc.cli", "train", str(run), f"model={warm_dir}", f"pool={tmp_path / 'pool.yaml'}",
           *RUN, "trackers=[trackio, wandb, mlflow]", "tracker_timeout_s=5", "tracker_samples_every=0"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    trackio_dir, out, mounted = run / "trackers" / "trackio", [], False
    try:
        for line in proc.stdout:
            out.append(line)
            if line.startswith("step    1 [") and not mounted:
                _wait_for_step_1(trackio_dir / "tbhpc.db")
                subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(trackio_dir)], check=True)
                mounted = True
                cores = [c for c in psutil.Process(proc.pid).children(recursive=True) if "wandb-core" in " ".join(c.cmdline())]
                assert cores, "no wandb service process to kill"
                for c in cores:
                    c.send_signal(signal.SIGKILL)
        code = proc.wait(timeout=600)
    finally:
        if mounted:
            subprocess.run(["umount", str(trackio_dir)])
        silent.close()
        if proc.poll() is None:
            proc.kill()
    text = "".join(out)
    assert code == 0, text[-4000:]
    warnings = [line for line in text.splitlines() if "warning: tracker" in line]
    assert sorted(re.search(r"tracker (\w+)", w).group(1) for w in warnings) == ["mlflow", "trackio", "wandb"], warnings
    assert "3 steps done" in text
    con = duckdb.connect(str(run / "results.duckdb"), read_only=True)
    assert [r[0] for r in con.execute("SELECT step FROM train_steps ORDER BY step").fetchall()] == [1, 2, 3]
    con.close()
    code = ("import json, sys; from trackio.sqlite_storage import SQLiteStorage as S; "
            "print(json.dumps(sorted({r['step'] for r in S.get_logs('tbhpc', 'run')})))")
    steps = subprocess.run([sys.executable, "-c", code], env=tracker_env(TRACKIO_DIR=str(trackio_dir)),
                           capture_output=True, text=True, check=True).stdout
    assert json.loads(steps.splitlines()[-1]) == [1]     # what it held before its directory went read-only
