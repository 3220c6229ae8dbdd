"""Small helpers shared by test modules (pytest puts tests/ on sys.path)."""
import os
from pathlib import Path

import duckdb

from tbhpc.cpuinfo import KERNEL_CAPS, cpu_class  # noqa: F401  (tests name the CPU class; KERNEL_CAPS: make test's AVX2 pass)


class _Notes(list):
    """Lines tests add for the run's closing summary (conftest.py). Under pytest-xdist the tests
    run in worker processes: each line is also appended to the file the controller names in
    TBHPC_MACHINE_NOTES, which its summary reads."""

    def append(self, line: str) -> None:
        super().append(line)
        path = os.environ.get("TBHPC_MACHINE_NOTES")
        if path:
            with open(path, "a", encoding="utf-8") as f:
                f.write(line.replace("\n", " ") + "\n")


MACHINE_NOTES: list[str] = _Notes()


def attempt_rows(run: Path) -> list[tuple]:
    """(task_id, attempt_index, reward, status) of a run, sorted by key."""
    con = duckdb.connect(str(run / "results.duckdb"), read_only=True)
    try:
        return con.execute("SELECT task_id, attempt_index, reward, status FROM attempts ORDER BY 1, 2").fetchall()
    finally:
        con.close()


def train_rows(run: Path) -> list[tuple]:
    """(train_step, task_id, attempt_index, reward) of a training run's rollouts, sorted: what two runs
    that drew the same groups share."""
    con = duckdb.connect(str(run / "results.duckdb"), read_only=True)
    try:
        return con.execute("SELECT train_step, task_id, attempt_index, reward FROM attempts ORDER BY 1, 2, 3").fetchall()
    finally:
        con.close()


def free_port() -> int:
    """A free rendezvous port outside the kernel's ephemeral range (tbhpc.train.dist.free_port_pair
    says why: a port from bind(0) once lost a CI run's LoRA fixture to another test's gloo connection)."""
    from tbhpc.train.dist import free_port_pair
    return free_port_pair()


def run_ranks(argv_of_rank, world: int, timeout: float = 300, env: dict | None = None) -> list[str]:
    """Start `world` processes of one gloo process group on this host (RANK/WORLD_SIZE/MASTER_*
    like torchrun), wait for all, fail with every rank's output tail if one fails. A rendezvous port
    taken by another process between its choice and its use (EADDRINUSE: the ranks wrote nothing yet)
    is chosen again, twice at most."""
    for attempt in range(3):
        try:
            return _run_ranks_once(argv_of_rank, world, timeout, env)
        except AssertionError as e:
            if attempt == 2 or "EADDRINUSE" not in str(e):
                raise
    raise AssertionError("unreachable")


def _run_ranks_once(argv_of_rank, world: int, timeout: float, env: dict | None) -> list[str]:
    import os
    import subprocess
    port = free_port()
    base = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            "WORLD_SIZE": str(world), **(env or {})}
    procs = [subprocess.Popen(argv_of_rank(r), env={**base, "RANK": str(r), "LOCAL_RANK": "0"},
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(world)]
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=timeout)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    if any(p.returncode for p in procs):
        raise AssertionError("\n".join(f"--- rank {r} (exit {p.returncode}) ---\n{o[-3000:]}"
                                       for r, (p, o) in enumerate(zip(procs, outs))))
    return outs


def eval_export(export: Path, out: Path, repo: Path) -> int:
    """A short eval campaign (2 smoke-pool tasks x 2) on an HF export, loaded in process like any
    user checkpoint; asserts it ran and returns the number of ok attempts."""
    import subprocess
    import sys
    res = subprocess.run([sys.executable, "-m", "tbhpc.cli", "eval", "--out", str(out), "policy=tokens",
                          f"policy_opts={{generator: local, model_path: {export}, max_tokens: 48, response_budget: 160}}",
                          "tasks=jobs/pools/smoke.yaml", "limit=2", "repeats=2"], cwd=repo, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    return sum(r[3] == "ok" for r in attempt_rows(out))


def require_slurm() -> None:
    """The local cluster is there (`make test` starts it), or the test skips; with
    TBHPC_REQUIRE_SLURM set (CI) it fails instead."""
    import shutil
    import subprocess

    import pytest
    if not os.environ.get("SLURM_CONF") or not shutil.which("sbatch"):
        if os.environ.get("TBHPC_REQUIRE_SLURM"):
            pytest.fail("TBHPC_REQUIRE_SLURM is set but no cluster is configured (SLURM_CONF)")
        pytest.skip("no Slurm cluster (run `make slurm-up` and source its env.sh)")
    out = subprocess.run(["sinfo", "-h", "-p", "batch", "-o", "%D %t"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def checkpoint_weights(path: Path) -> dict:
    """Every tensor of an HF checkpoint directory as numpy arrays: one model.safetensors, or the shards
    each training rank wrote (listed in model.safetensors.index.json)."""
    import json

    from safetensors.numpy import load_file
    index = path / "model.safetensors.index.json"
    if not index.exists():
        return load_file(str(path / "model.safetensors"))
    out: dict = {}
    for shard in sorted(set(json.loads(index.read_text())["weight_map"].values())):
        out.update(load_file(str(path / shard)))
    return out


def token_leaks(run: Path, extra: tuple[Path, ...] = ()) -> list[str]:
    """Where the run's server token shows up outside its own file: every file under `run` (and
    `extra`) read as bytes, every row of every DuckDB table, every string in HDF5 files. []: nowhere."""
    token = (run / "server.token").read_text().strip()
    hits = []
    for path in [p for root in (run, *extra) for p in Path(root).rglob("*") if p.is_file()]:
        if path.name == "server.token":
            continue
        if path.suffix == ".duckdb":            # strings may be stored compressed: read them back
            con = duckdb.connect(str(path), read_only=True)
            try:
                for (table,) in con.execute("SELECT table_name FROM information_schema.tables").fetchall():
                    if token in repr(con.execute(f'SELECT * FROM "{table}"').fetchall()):
                        hits.append(f"{path}: table {table}")
            finally:
                con.close()
        elif path.suffix in (".h5", ".hdf5"):
            import h5py
            found = []
            with h5py.File(path, "r") as f:
                f.visititems(lambda name, obj: found.append(name) if token in repr(dict(obj.attrs)) or (
                    hasattr(obj, "dtype") and obj.dtype.kind in "OSU" and token in repr(obj[()])) else None)
            hits += [f"{path}: {name}" for name in found]
        elif token.encode() in path.read_bytes():
            hits.append(str(path))
    return hits


def warm_rank_rollouts(warm_dir, ids: list[str], tasks: dict, env_of):
    """The trainer's rank rollouts of `ids` (2 groups of 2, the in-process generator on the warm
    model, token-exact) on whatever environment `env_of(task)` gives: (tokenizer, rollouts)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tbhpc.env.judge import KeywordJudge
    from tbhpc.env.users import ScriptedUser
    from tbhpc.policy.generation import LocalGenerator
    from tbhpc.policy.tokens import TokenPolicy
    from tbhpc.train.queue import DrawQueue, make_store
    from tbhpc.train.rollouts import RolloutContext, run_rank_rollouts
    tok = AutoTokenizer.from_pretrained(warm_dir)
    model = AutoModelForCausalLM.from_pretrained(warm_dir, dtype=torch.float32).eval()
    policy = TokenPolicy(generator="local", max_tokens=48, response_budget=160)
    policy.use(tok, LocalGenerator.for_tokenizer(model, tok))
    ctx = RolloutContext(ids, tasks, env_of, policy, ScriptedUser(), KeywordJudge(), group_size=2, seed=1,
                         max_reruns=1, episodes_in_flight=2)
    outcomes = run_rank_rollouts(ctx, DrawQueue(make_store(0, 1), step=1, need=1, cap=2), step=1, expected_version=0)
    return tok, [r for g in outcomes for r in g.rollouts]


def tracker_env(**extra) -> dict:
    """The caller's environment without its tracker variables and W&B key: every decision is tbhpc's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "MLFLOW_", "TRACKIO_"))
           and k not in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_JOB_ID")}
    return {**env, "OMP_NUM_THREADS": "1", "NETRC": "/nonexistent", **extra}


def step_scalars(run: Path) -> dict[int, dict]:
    """train_steps' numbers, as a tracker must hold them: train/<column> for every numeric value."""
    con = duckdb.connect(str(run / "results.duckdb"), read_only=True)
    cur = con.execute("SELECT * FROM train_steps ORDER BY step")
    names = [d[0] for d in cur.description]
    rows = [dict(zip(names, r)) for r in cur.fetchall()]
    con.close()
    return {r["step"]: {f"train/{k}": v for k, v in r.items()
                        if isinstance(v, (int, float)) and not isinstance(v, bool)} for r in rows}


def trackio_record(trackio_dir: Path, project: str) -> dict:
    """trackio's own reader (its Api and SQLite storage) in a fresh process: runs, logs, config."""
    import json
    import subprocess
    import sys
    code = ("import json, trackio; from trackio.sqlite_storage import SQLiteStorage as S; "
            f"runs = trackio.Api().runs({project!r}); names = [r.name for r in runs]; "
            f"print(json.dumps({{'runs': names, 'logs': S.get_logs({project!r}, names[0]) if names else [], "
            "'config': runs[0].config if names else None}))")
    out = subprocess.run([sys.executable, "-c", code], env=tracker_env(TRACKIO_DIR=str(trackio_dir)),
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.splitlines()[-1])


def wandb_records(offline_dir: Path) -> list[dict]:
    """An offline wandb run's records, read by `wandb leet inspect --json` (wandb's own reader)."""
    import json
    import subprocess
    import sys
    res = subprocess.run([str(Path(sys.executable).parent / "wandb"), "leet", "inspect", "--json", str(offline_dir)],
                         capture_output=True, text=True, check=True, env=tracker_env())
    return [json.loads(line) for line in res.stdout.splitlines()]
