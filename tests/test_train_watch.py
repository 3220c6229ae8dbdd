"""No rank waits for a dead or hung peer without bound (tbhpc/train/watch.py): the logic on one
store with simulated peers, then for real on the local Slurm cluster: one rank of a 3-rank training
job frozen with SIGSTOP ends the whole job within a bounded time, with one line naming it."""
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tbhpc import progress
from tbhpc.train.watch import RankLost, Watch, collectives

REPO = Path(__file__).resolve().parents[1]


def _store():
    import torch.distributed as dist
    return dist.HashStore()


def test_a_peer_whose_heartbeat_stops_is_named_with_both_phases():
    store = _store()
    lost = []
    me = Watch(store, 0, 2, dead_s=0.6, stall_s=60, field="collective_timeout_s", on_fatal=lost.append, beat_s=0.1)
    peer = Watch(store, 1, 2, dead_s=60, stall_s=60, field="collective_timeout_s", on_fatal=lambda m: None, beat_s=0.1)
    peer.phase, me.phase = "the rollouts of step 3", "the update of step 3"
    peer.start(), me.start()
    time.sleep(0.8)
    assert lost == []                          # both alive
    peer.stop()                                # frozen: its beats stop
    deadline = time.monotonic() + 5
    while not lost and time.monotonic() < deadline:
        time.sleep(0.05)
    me.stop()
    assert len(lost) == 1 and "\n" not in lost[0]
    assert "rank 1 stopped answering" in lost[0] and "(it was in the rollouts of step 3)" in lost[0]
    assert "while this rank was in the update of step 3" in lost[0] and "'collective_timeout_s'" in lost[0]


def test_the_meeting_waits_for_a_slow_peer_that_works_and_gives_up_on_one_that_does_not():
    store = _store()
    me = Watch(store, 0, 2, dead_s=60, stall_s=0.8, field="collective_timeout_s", beat_s=0.05)
    peer = Watch(store, 1, 2, dead_s=60, stall_s=60, field="collective_timeout_s", beat_s=0.05)
    me.start(), peer.start()
    working = threading.Event()

    def slow_peer():       # works (its count moves) for 2 s, longer than stall_s, then arrives
        t0 = time.monotonic()
        while time.monotonic() - t0 < 2:
            progress.mark()
            time.sleep(0.05)
        peer.meet("rollouts-1", "the rollouts of step 1")
        working.set()
    threading.Thread(target=slow_peer, daemon=True).start()
    me.meet("rollouts-1", "the rollouts of step 1")
    assert working.wait(5)
    # step 2: the peer is alive (its heartbeat moves) but finishes no work and never arrives
    with pytest.raises(RankLost) as err:
        me.meet("rollouts-2", "the rollouts of step 2")
    me.stop(), peer.stop()
    assert "rank 1 finished no work for" in str(err.value) and "the rollouts of step 2" in str(err.value)
    assert "field 'collective_timeout_s' is 0.8 s" in str(err.value)


def test_under_nccl_a_collective_that_never_completes_still_ends_in_one_line():
    """NCCL never raises on the host (stand-in: the phase's body blocks as a host sync on a hung NCCL
    collective does); the timer gives the line, through the watch's fatal path, before the watchdog."""
    store = _store()
    lost = []
    watch = Watch(store, 0, 2, dead_s=60, stall_s=60, field="collective_timeout_s", on_fatal=lost.append, beat_s=0.1)
    peer = Watch(store, 1, 2, dead_s=60, stall_s=60, field="collective_timeout_s", beat_s=0.1)
    watch.start(), peer.start()
    with collectives(watch, "the update of step 2", 0.5, nccl=True):
        deadline = time.monotonic() + 5
        while not lost and time.monotonic() < deadline:
            time.sleep(0.05)
    with collectives(watch, "the update of step 3", 0.5, nccl=True):
        pass                                        # done in time: the timer is cancelled
    time.sleep(0.8)
    watch.stop(), peer.stop()
    assert len(lost) == 1 and "\n" not in lost[0], lost
    assert "a collective of the update of step 2 waited longer than field 'collective_timeout_s' (0.5 s)" in lost[0]


def test_one_rank_needs_no_watch():
    w = Watch(_store(), 0, 1, dead_s=1, stall_s=1, field="f").start()
    w.meet("x", "anything")          # returns at once
    assert w._thread is None


@pytest.mark.slow
def test_a_frozen_rank_ends_the_whole_slurm_job_in_bounded_time(warm_dir, tmp_path):
    """3 CPU ranks under Slurm, collective_timeout_s 20 (so a silent peer counts as gone after 20 s);
    rank 1 is frozen (SIGSTOP) during step 1: a rank says which one and in which phase, the job ends
    (srun --kill-on-bad-exit), no rank process is left and the allocation is free."""
    if not os.environ.get("SLURM_CONF") or not shutil.which("sbatch"):
        if os.environ.get("TBHPC_REQUIRE_SLURM"):
            pytest.fail("TBHPC_REQUIRE_SLURM is set but no cluster is configured (SLURM_CONF)")
        pytest.skip("no Slurm cluster (run `make slurm-up` and source its env.sh)")
    pool = tmp_path / "pool.yaml"
    pool.write_text("tasks: [consulting-leave_balance-001, consulting-leave_balance-002]\n")
    run = tmp_path / "run"
    sub = subprocess.run([sys.executable, "-m", "tbhpc.cli", "submit", "train", "--out", str(run), f"model={warm_dir}",
                          f"pool={pool}", "generator=local", "steps=20", "group_size=4", "groups_per_step=2",
                          "max_tokens=48", "response_budget=160", "collective_timeout_s=20", "nodes=3",
                          "slurm={cpus_per_task: 1, mem: null, time: '00:30:00'}"],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert sub.returncode == 0, sub.stderr
    import yaml
    job = str(yaml.safe_load((run / "slurm" / "train-jobs.yaml").read_text())["train"])
    victim = _rank_pid(run, 1, deadline_s=300)
    deadline = time.monotonic() + 300
    while not (run / "logs" / "train_steps.jsonl").exists() and not list(run.glob("buffers/step-000001*")):
        assert time.monotonic() < deadline, "step 1 never got going"
        if _rollouts_started(run):
            break
        time.sleep(0.5)
    os.kill(victim, signal.SIGSTOP)
    frozen_at = time.monotonic()
    while _job_alive(job):
        assert time.monotonic() - frozen_at < 180, "the job outlived a frozen rank by 3 minutes"
        time.sleep(1)
    ended_s = time.monotonic() - frozen_at
    log = "\n".join(p.read_text(errors="replace") for p in (run / "logs" / "slurm").glob("*.out"))
    lines = [ln for ln in log.splitlines() if ln.startswith("tbhpc: error:") and "rank 1" in ln]
    from helpers import MACHINE_NOTES
    MACHINE_NOTES.append(f"frozen rank: job ended {ended_s:.0f} s after SIGSTOP: {lines[:1]}")
    assert lines, log[-3000:]
    assert "stopped answering" in lines[0] and "'collective_timeout_s'" in lines[0]
    assert not _alive(victim), "the frozen rank outlived its job"


def _rank_pid(run: Path, rank: int, deadline_s: float) -> int:
    """The PID of the trainer process with SLURM_PROCID=rank for this run (the local cluster's nodes
    are processes of this machine)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                cmd = (proc / "cmdline").read_bytes().split(b"\0")
                if b"tbhpc.cli" not in cmd or b"train" not in cmd or str(run).encode() not in cmd:
                    continue
                env = dict(kv.split(b"=", 1) for kv in (proc / "environ").read_bytes().split(b"\0") if b"=" in kv)
            except OSError:
                continue
            if env.get(b"SLURM_PROCID") == str(rank).encode():
                return int(proc.name)
        time.sleep(0.5)
    raise AssertionError(f"no rank {rank} process of {run} appeared")


def _rollouts_started(run: Path) -> bool:
    logs = list((run / "logs" / "slurm").glob("*.out"))
    return any("step 1" in p.read_text(errors="replace") or "rollouts" in p.read_text(errors="replace") for p in logs)


def _job_alive(job: str) -> bool:
    out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True)
    return bool(out.stdout.strip())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return status.exists() and "zombie" not in status.read_text()


RANK_SCRIPT = """
import os, sys, time, json
from tbhpc.train.config import TrainConfig
from tbhpc.train.engine import DistEnv, Engine
from tbhpc.train.queue import make_store
from tbhpc.train.watch import RankLost, Watch, collectives
sys.path.insert(0, {tests!r})
from train_rank import batch
from tbhpc.train.packing import pack
env = DistEnv.from_environ()
cfg = TrainConfig(model={model!r}, pool="-", zero_stage=3, collective_timeout_s=4)
eng = Engine(cfg, env)
watch = Watch(make_store(env.rank, env.world, env.master_addr, env.master_port + 1), env.rank, env.world,
              cfg.silence_timeout, cfg.collective_timeout, "collective_timeout_s").start()
eps, adv = batch(eng.module.config.vocab_size)
if env.rank == 1:
    time.sleep(12)        # alive (its heartbeat moves) but late to the update's first collective
try:
    with collectives(watch, "the update of step 1", cfg.collective_timeout):
        eng.update(pack(eps[env.rank::2], adv[env.rank::2], 96))
except RankLost as exc:
    print("LOST", exc, flush=True)
os._exit(0)
"""


@pytest.mark.slow
def test_a_collective_timeout_is_one_line_naming_the_phase_and_the_field(tiny_dir, tmp_path):
    """2 gloo ranks, process-group timeout 4 s, rank 1 twelve seconds late: rank 0's all-reduce times out
    and says so in one line (rank 1 still answers: its heartbeat is no news)."""
    from helpers import free_port
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT.format(tests=str(Path(__file__).parent), model=str(tiny_dir)))
    base = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
            "WORLD_SIZE": "2", "LOCAL_RANK": "0"}
    procs = [subprocess.Popen([sys.executable, str(script)], env={**base, "RANK": str(r)}, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(2)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    lost = [ln for ln in outs[0].splitlines() if ln.startswith("LOST")]
    assert lost, outs[0][-3000:]
    assert "a collective of the update of step 1 waited longer than field 'collective_timeout_s' (4 s)" in lost[0]
    assert "every rank still answers" in lost[0]
    # rank 0 then ended; rank 1, still asleep, finds its store gone and ends too, in one line of its own
    assert procs[1].returncode == 2, outs[1][-2000:]
    assert "tbhpc: error: rank 1: rank 0 (which serves the draw queue's store) stopped answering" in outs[1]
