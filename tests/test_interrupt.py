"""Ctrl-C on a campaign (issue 26): the first SIGINT stops the workers and the command exits
within seconds with one line and no process left behind; a re-run completes every key once.
Real processes and signals: the eval runs in its own session so every descendant is findable."""
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

pytestmark = pytest.mark.xdist_group("interrupt")
REPEATS = 60  # 18,000 attempts: ten short tries cannot finish them, so every try must be interrupted


def _session_members(sid: int) -> list[int]:
    """PIDs of the live processes of session `sid` (the eval, its workers, the resource tracker)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)": state ppid pgrp session ...
        if int(fields[3]) == sid and fields[0] != "Z":
            out.append(int(entry.name))
    return out


def _eval(out: Path, stderr=subprocess.PIPE) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "tbhpc.cli", "eval", "--out", str(out), "--workers", "2",
           "split=all", "limit=300", f"repeats={REPEATS}", "chunk_size=16"]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=stderr, text=True,
                            start_new_session=True, env={**os.environ, "OMP_NUM_THREADS": "1"})


def _wait_for_the_campaign(proc: subprocess.Popen, log: Path, timeout: float = 120) -> None:
    """Until the command has said that its attempts are planned (its executor starts next): on a
    loaded machine imports and planning take longer than any fixed delay, and ten interrupts that
    all land before the campaign would test only the start."""
    deadline = time.monotonic() + timeout
    while "attempts planned" not in log.read_text(errors="replace"):
        assert proc.poll() is None, f"the eval ended before its campaign started: {log.read_text()[-2000:]}"
        assert time.monotonic() < deadline, f"no campaign {timeout:.0f} s after the start"
        time.sleep(0.05)


def test_sigint_at_ten_random_points_exits_cleanly_and_resumes_exactly(tmp_path):
    out = tmp_path / "run"
    rng = random.Random(26)
    for attempt in range(10):
        delay = rng.uniform(0.3, 2.5)
        to_group = attempt % 2 == 1     # a terminal's Ctrl-C goes to the whole process group
        from_start = attempt % 3 == 0   # 4 tries count from the start (imports, planning), 6 from the campaign's
        err_path = tmp_path / f"stderr-{attempt}.txt"
        with open(err_path, "w") as err_file:
            proc = _eval(out, stderr=err_file)
        if not from_start:
            _wait_for_the_campaign(proc, err_path)
        time.sleep(delay)
        (os.killpg if to_group else os.kill)(proc.pid, signal.SIGINT)
        sent = time.monotonic()
        if attempt == 9:                # a second Ctrl-C while it cleans up: exit at once
            time.sleep(0.2)
            try:
                os.killpg(proc.pid, signal.SIGINT)
            except ProcessLookupError:
                pass
        try:
            proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"try {attempt} (SIGINT after {delay:.2f} s): still running 10 s after the interrupt")
        took = time.monotonic() - sent
        stderr = err_path.read_text(errors="replace")
        deadline = time.monotonic() + 3
        while (left := _session_members(proc.pid)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not left, f"try {attempt}: processes survived the interrupt: {left}"
        lines = [ln for ln in stderr.replace("\r", "\n").splitlines() if ln.strip()]
        assert "Traceback" not in stderr, f"try {attempt}: {stderr[-2000:]}"
        # the second Ctrl-C may land after the cleanup, as the interpreter exits: killed by SIGINT
        allowed = (130, -signal.SIGINT) if attempt == 9 else (130,)
        assert proc.returncode in allowed, f"try {attempt}: rc {proc.returncode}: {stderr[-2000:]}"
        assert "interrupted" in lines[-1] and lines[-1].startswith("tbhpc: "), lines[-3:]
        print(f"try {attempt}: SIGINT to {'group' if to_group else 'process'} {delay:.2f} s after "
              f"{'the start' if from_start else 'the campaign began'}, "
              f"exited {took:.2f} s later: {lines[-1][:120]}")
    proc = _eval(out)
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr[-2000:]
    con = duckdb.connect(str(out / "results.duckdb"), read_only=True)
    try:
        n, keys, ok = con.execute("SELECT count(*), count(DISTINCT (task_id, attempt_index)), "
                                  "count(*) FILTER (status = 'ok') FROM attempts").fetchone()
    finally:
        con.close()
    assert n == keys == ok == 300 * REPEATS
    log = (out / "logs" / "campaign.log").read_text()
    assert "interrupted" in log


def test_an_unexpected_exception_is_one_line_and_a_traceback_file(tmp_path, monkeypatch, capsys):
    from tbhpc import cli
    from tbhpc.cli import tasks as tasks_command

    def broken(args):
        raise ZeroDivisionError("division by zero in a bug")

    monkeypatch.setattr(tasks_command, "run", broken)
    monkeypatch.setenv("TBHPC_CRASH_DIR", str(tmp_path))
    monkeypatch.delenv("TBHPC_TRACEBACK", raising=False)
    assert cli.main(["tasks", "list"]) == 70
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "ZeroDivisionError: division by zero in a bug" in err, err
    (written,) = tmp_path.glob("tbhpc-crash-*.txt")
    assert str(written) in err
    text = written.read_text()
    assert "Traceback" in text and "def broken" not in text and "in broken" in text


OTHER_THREAD = """
import json, os, signal, sys, threading, time
from tbhpc import interrupts


def one_try():
    # One SIGINT sent by a thread started before the block (SIGINT unblocked there) while the main
    # thread runs Python inside it: (loop steps before the interrupt showed, seconds until it was sent).
    go, sent = threading.Event(), threading.Event()

    def other_thread():
        go.wait(120)
        os.kill(os.getpid(), signal.SIGINT)
        sent.set()

    thread = threading.Thread(target=other_thread)
    thread.start()
    steps, t0, waited = 0, time.monotonic(), -1.0
    try:
        with interrupts.workers_born_ignoring_sigint():
            go.set()
            sent.wait(120)
            waited = time.monotonic() - t0
            for _ in range(100_000):     # plenty of bytecode boundaries where a handler would run
                steps += 1
    except KeyboardInterrupt:
        thread.join()
        return steps, round(waited, 3)
    signal.signal(signal.SIGINT, signal.SIG_IGN)     # a late one must not hide the report below
    thread.join()
    return -1, round(waited, 3)


interrupts.install()
print(json.dumps([one_try() for _ in range(20)] + [interrupts.pending()]))
"""


def test_a_sigint_delivered_to_another_thread_waits_for_the_end_of_the_worker_start_block():
    """A signal mask is per thread: a SIGINT the kernel hands to another thread (rich's refresher
    during a campaign) still runs Python's handler in the main thread, so masking alone let a
    KeyboardInterrupt land inside Process.start() and the half-started worker printed a traceback
    (CI, once in ten interrupts). Inside the block the interrupt is held and raised once, at its end."""
    # in a process of its own: its signals never reach the pytest worker, and no thread another
    # test left in that worker competes with the sender (CI: twice a worker was ended by a SIGINT
    # that arrived after the block, the sender's wait at 10 s, then at 120 s)
    out = subprocess.run([sys.executable, "-c", OTHER_THREAD], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    *tries, pending = json.loads(out.stdout)
    assert [steps for steps, _ in tries] == [100_000] * 20 and pending, tries


LEAK = """
import multiprocessing as mp, os, sys
from tbhpc.interrupts import release_multiprocessing_resources
q = mp.get_context("spawn").Queue()     # named semaphores, registered with the resource tracker
if sys.argv[1] == "release":
    release_multiprocessing_resources()
os._exit(130)                           # how an interrupted command leaves, q still referenced
"""


def test_an_interrupted_exit_leaves_no_semaphore_for_the_tracker_to_report():
    """`os._exit` skips multiprocessing's exit clean-up: a pool's queues still referenced then (a
    traceback's frames can hold one) made the resource tracker print a 'leaked semaphore' warning
    after the one-line report (CI, about 1 interrupt run in 4)."""
    runs = {how: subprocess.run([sys.executable, "-c", LEAK, how], capture_output=True, text=True, timeout=60)
            for how in ("release", "plain")}
    assert runs["plain"].returncode == 130 and "leaked semaphore" in runs["plain"].stderr   # the failure is real
    assert runs["release"].returncode == 130 and runs["release"].stderr == ""
