"""Hostile input, command by command (issue 26): every case ends with the expected exit status,
one line on stderr naming the culprit (file, field, flag or value), no traceback, and nothing
written or changed around it (every file of the test's world checksummed before and after).

The world: a finished eval run, a probe run, a run whose results file is damaged in the middle,
user files a careless command could overwrite, broken task packs, price tables and ThinkingBox
result files with values of the wrong type. Commands run in this process (`tbhpc.cli.main`) for
speed; the Ctrl-C and crash-line cases that need a real process are in tests/test_interrupt.py.
"""
import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
import yaml

from tbhpc import cli

pytestmark = pytest.mark.xdist_group("hostile")


def _main(argv: list[str]) -> int:
    try:
        return cli.main(argv)
    except SystemExit as exc:      # argparse
        return exc.code if isinstance(exc.code, int) else 2


def _checksums(root: Path) -> dict[str, str]:
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and p.name != ".merge.lock":
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
        elif p.is_dir():
            out[str(p.relative_to(root)) + "/"] = "dir"
    return out


def _damage_a_data_block(db: Path) -> int:
    """Overwrite 64 bytes inside a block that holds data (not the header: it opens, and fails when
    the block is read), found by trying each 256 KiB block from the middle on a copy."""
    import duckdb

    from tbhpc.store.health import DamagedResults, check_every_block
    block = 256 * 1024
    size = db.stat().st_size
    offsets = sorted(range(3 * 4096 + block // 2, size, block), key=lambda o: abs(o - size // 2))
    for offset in offsets:
        trial = db.with_name("trial.duckdb")
        shutil.copy(db, trial)
        with open(trial, "r+b") as f:
            f.seek(offset)
            f.write(b"\xde\xad\xbe\xef" * 16)
        try:
            con = duckdb.connect(str(trial), read_only=True)
        except duckdb.Error:
            continue        # header-level damage: fine too, but the point here is damage found late
        try:
            check_every_block(con, trial)
        except DamagedResults:
            con.close()
            os.replace(trial, db)
            return offset
        con.close()
    raise AssertionError(f"{db}: no block whose damage is detected")


def _bad_pack(world: Path, how: str) -> Path:
    from tbhpc.domains.pack import render_domain_file
    from tbhpc.tasks.loader import load_pack
    good = [t for t in load_pack(None) if t.domain == "retail" and t.template == "order_status"][:2]
    doc = yaml.safe_load(render_domain_file("retail", good))
    for t in doc["tasks"]:
        t["split"] = "train"
    task = doc["tasks"][0]
    if how == "tool":
        task["golden"]["tool_interactions"][0]["tool"] = "find_customer_by_mail"
    elif how == "type":
        task["golden"]["tool_interactions"][1]["parameters"]["order_id"] = 2001
    elif how == "domain":
        doc["domain"] = "retial"
    path = world / f"pack-{how}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return path


def _tb_file(world: Path, name: str, line: dict) -> None:
    good = {"uid": "a.py:t1", "test_result": {"result": True}, "usage": [{"input_tokens": 3, "output_tokens": 2}]}
    (world / f"tb-{name}.jsonl").write_text(json.dumps(good) + "\n" + json.dumps({**good, **line}) + "\n")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    w = tmp_path_factory.mktemp("hostile")
    cwd = os.getcwd()
    os.chdir(w)
    try:
        assert _main(["eval", "--out", "run", "limit=4", "repeats=2"]) == 0
        assert _main(["probe", "--out", "probe", "limit=6", "repeats=4", "policy_opts={skill: 0.6}"]) == 0
        assert _main(["eval", "--out", "damaged", "split=all", "limit=300", "repeats=4"]) == 0
    finally:
        os.chdir(cwd)
    _damage_a_data_block(w / "damaged" / "results.duckdb")
    for leftover in (w / "damaged").glob("trial.duckdb*"):
        leftover.unlink()
    (w / "notes.txt").write_text("a user's file\n")
    (w / "folder").mkdir()
    (w / "folder" / "README.md").write_text("a user's folder\n")
    (w / "not-hf").mkdir()
    (w / "not-hf" / "config.json").write_text("{}\n")          # a config.json, but nothing transformers can load
    shutil.copy(Path(cli.__file__).parent.parent / "data" / "packs" / "default" / "retail.yaml", w / "mypack.yaml")
    for how in ("tool", "type", "domain"):
        _bad_pack(w, how)
    repo = Path(cli.__file__).resolve().parent.parent.parent
    shutil.copy(repo / "jobs" / "train-reference.yaml", w / "ref.yaml")
    shutil.copytree(repo / "jobs" / "models" / "qwen3-27b-class", w / "m27")
    (w / "moe").mkdir()
    (w / "moe" / "config.json").write_text(json.dumps({**json.loads((w / "m27" / "config.json").read_text()),
                                                       "num_experts": 64}))
    (w / "prices-nan.yaml").write_text("agent: {input: .nan, output: 1}\n")
    (w / "prices-neg.yaml").write_text("agent: {input: -3, output: 1}\n")
    (w / "prices-str.yaml").write_text("agent: {input: cheap}\n")
    (w / "prices-role.yaml").write_text("agnet: {input: 1}\n")
    (w / "prices-list.yaml").write_text("- agent\n- 3\n")
    (w / "prices-flat.yaml").write_text("agent: 3\n")
    (w / "train-run").mkdir()
    (w / "train-run" / "config.yaml").write_text("model: no-such-model\n")
    for name, line in {"yes": {"test_result": {"result": "yes"}}, "intuid": {"uid": 5},
                       "many": {"usage": [{"input_tokens": "many"}]}, "neg": {"usage": [{"output_tokens": -5}]},
                       "float": {"usage": [{"input_tokens": 2.5}]}, "reward": {"test_result": {"result": True, "reward": "1"}},
                       "sys": {"is_system_error": "no"}}.items():
        _tb_file(w, name, line)
    (w / "tb-nan.jsonl").write_text('{"uid": "a.py:t1", "test_result": {"result": true}, '
                                    '"usage": [{"input_tokens": NaN}]}\n')
    (w / "tb-notjson.jsonl").write_text('{"uid": "a.py:t1", "test_result": {"result": true}\n')
    return w


RUNS = "run"
D = "damaged"
CASES = [
    # 1. packs that `tasks validate` refuses are refused by every command that would run them
    ("pack-tool-eval", ["eval", "--out", "new", "pack=pack-tool.yaml", "split=train"], 2, ["pack-tool.yaml", "unknown tool"]),
    ("pack-type-probe", ["probe", "--out", "new", "pack=pack-type.yaml", "split=train"], 2, ["pack-type.yaml", "order_id"]),
    ("pack-domain-eval", ["eval", "--out", "new", "pack=pack-domain.yaml", "split=train"], 2,
     ["unknown domain 'retial' (known: retail,"]),
    ("pack-domain-validate", ["tasks", "validate", "pack-domain.yaml"], 2, ["pack-domain.yaml", "retial"]),
    ("pack-missing", ["eval", "--out", "new", "pack=no-such-pack"], 2, ["no-such-pack"]),
    ("task-missing", ["episode", "--task", "no-such-task"], 2, ["no-such-task"]),
    # 2. sql: only queries, nothing outside the runs
    ("sql-drop", ["sql", ".", "DETACH r0; ATTACH 'run/results.duckdb' AS w; DROP TABLE w.main.attempts"], 2, ["DETACH"]),
    ("sql-copy", ["sql", ".", "COPY (SELECT 1) TO 'run/config.yaml'"], 2, ["COPY"]),
    ("sql-read-text", ["sql", ".", "SELECT * FROM read_text('/etc/hostname')"], 2, ["sql:", "disabled"]),
    ("sql-read-csv", ["sql", ".", "SELECT * FROM read_csv('notes.txt')"], 2, ["sql:", "disabled"]),
    ("sql-set", ["sql", ".", "SET enable_external_access = true"], 2, ["SET"]),
    ("sql-insert", ["sql", ".", "INSERT INTO attempts SELECT * FROM attempts"], 2, ["INSERT"]),
    ("sql-install", ["sql", ".", "INSTALL httpfs"], 2, ["INSTALL"]),
    ("sql-empty", ["sql", ".", "  "], 2, ["empty"]),
    ("sql-syntax", ["sql", ".", "SELEC 1"], 2, ["sql:", "syntax"]),
    # 4. output paths
    ("out-empty", ["eval", "--out", "", "limit=1"], 2, ["--out", "empty path"]),
    ("out-file", ["eval", "--out", "notes.txt", "limit=1"], 2, ["notes.txt", "is a file"]),
    ("out-under-file", ["eval", "--out", "notes.txt/run", "limit=1"], 2, ["notes.txt", "is a file"]),
    ("out-user-folder", ["eval", "--out", "folder", "limit=1"], 2, ["folder", "README.md", "not a run directory"]),
    ("out-probe-into-eval", ["eval", "--out", "probe", "limit=6", "repeats=4"], 2, ["probe", "different campaign"]),
    ("parquet-empty", ["export", RUNS, "--parquet", ""], 2, ["--parquet", "empty path"]),
    ("parquet-folder", ["export", RUNS, "--parquet", "folder"], 2, ["--parquet folder", "README.md", "--force"]),
    ("parquet-file", ["export", RUNS, "--parquet", "notes.txt"], 2, ["notes.txt", "is a file"]),
    ("report-folder", ["report", RUNS, "--out", "folder"], 2, ["folder", "README.md", "--force"]),
    ("export-tb-folder", ["tasks", "export-tb", "--out", "folder"], 2, ["folder", "README.md"]),
    ("generate-folder", ["tasks", "generate", "--out", "folder"], 2, ["folder", "README.md"]),
    ("select-over-pack", ["select", "probe", "--out", "mypack.yaml"], 2, ["mypack.yaml", "--force"]),
    ("select-over-notes", ["select", "probe", "--out", "notes.txt"], 2, ["notes.txt", "--force"]),
    ("select-into-folder", ["select", "probe", "--out", "folder"], 2, ["folder", "is a folder"]),
    ("import-tb-over-file", ["import-tb", "tb-yes.jsonl", "--out", "notes.txt"], 2, ["notes.txt", "is a file"]),
    ("import-tb-over-run", ["import-tb", "tb-many.jsonl", "--out", RUNS], 2, [RUNS, "already exists"]),
    ("train-on-eval-run", ["train", RUNS, "model=folder", "pool=mypack.yaml"], 2, ["'eval'", "not 'train'"]),
    ("demo-out-file", ["demo", "out=notes.txt"], 2, ["notes.txt", "is a file"]),
    ("demo-out-empty", ["demo", "out="], 2, ["'out'"]),
    ("demo-out-blank", ["demo", "out=' '"], 2, ["'out'", "empty"]),
    # 5. a damaged results file: one line naming it and the rebuild command; sql tells it from busy
    ("damaged-validate", ["validate", D], 2, [f"{D}/results.duckdb", "damaged", f"merge {D} --rebuild"]),
    ("damaged-merge", ["merge", D], 2, [f"{D}/results.duckdb", "--rebuild"]),
    ("damaged-agg", ["agg", D], 2, [f"{D}/results.duckdb", "--rebuild"]),
    ("damaged-report", ["report", D, "--out", "rep"], 2, [f"{D}/results.duckdb", "--rebuild"]),
    ("damaged-export", ["export", D, "--parquet", "pq"], 2, [f"{D}/results.duckdb", "--rebuild"]),
    ("damaged-resume", ["eval", "--out", D, "split=all", "limit=300", "repeats=4"], 2, [f"{D}/results.duckdb", "--rebuild"]),
    ("damaged-sql", ["sql", D, "SELECT max(hash(transcript)) FROM attempts"], 2, ["results.duckdb", "damaged", "--rebuild"]),
    ("sql-wait-nan", ["sql", "--wait", "nan", ".", "SELECT 1"], 2, ["--wait", "nan"]),
    ("sql-wait-inf", ["sql", "--wait", "inf", ".", "SELECT 1"], 2, ["--wait", "inf"]),
    ("sql-wait-negative", ["sql", "--wait", "-1", ".", "SELECT 1"], 2, ["--wait", "-1"]),
    # 6. policy options and malformed values
    ("opts-typo", ["eval", "--out", "new", "limit=1", "policy_opts={skil: 0.7}"], 2, ["unknown field 'skil'", "skill"]),
    ("opts-brace", ["eval", "--out", "new", "limit=1", "policy_opts={skill: 0.7"], 2, ["malformed YAML"]),
    ("opt-typo", ["episode", "--task", "TASK", "--opt", "skil=0.7"], 2, ["'skil'"]),
    ("opt-no-equals", ["episode", "--task", "TASK", "--opt", "skill"], 2, ["--opt", "key=value"]),
    ("opt-brace", ["episode", "--task", "TASK", "--opt", "skill={0.7"], 2, ["--opt", "malformed YAML"]),
    ("servers-missing", ["eval", "--out", "new", "servers=no-servers.yaml"], 2, ["'servers'", "no-servers.yaml"]),
    ("override-unknown", ["eval", "--out", "new", "limt=1"], 2, ["unknown field 'limt'"]),
    # 7. ranges
    ("limit-negative", ["eval", "--out", "new", "limit=-2"], 2, ["'limit'", "-2"]),
    ("limit-zero", ["eval", "--out", "new", "limit=0"], 2, ["'limit'", ">= 1"]),
    ("repeats-zero", ["eval", "--out", "new", "repeats=0"], 2, ["'repeats'"]),
    ("workers-zero", ["eval", "--out", "new", "--workers", "0"], 2, ["--workers", "0"]),
    ("skill-nan", ["eval", "--out", "new", "limit=1", "policy_opts={skill: .nan}"], 2, ["'skill'", "nan"]),
    ("skill-five", ["eval", "--out", "new", "limit=1", "policy_opts={skill: 5}"], 2, ["'skill'"]),
    ("skill-negative", ["eval", "--out", "new", "limit=1", "policy_opts={skill: -1}"], 2, ["'skill'"]),
    ("train-temperature", ["train", "new", "model=folder", "pool=mypack.yaml", "temperature=-1"], 2, ["'temperature'"]),
    ("train-top-p", ["train", "new", "model=folder", "pool=mypack.yaml", "top_p=5"], 2, ["'top_p'"]),
    ("train-top-k", ["train", "new", "model=folder", "pool=mypack.yaml", "top_k=-3"], 2, ["'top_k'"]),
    ("train-lr-nan", ["train", "new", "model=folder", "pool=mypack.yaml", "lr=.nan"], 2, ["'lr'"]),
    ("train-pool-missing", ["train", "new", "model=folder", "pool=no-pool.yaml"], 2, ["'pool'", "no-pool.yaml"]),
    ("train-model-missing", ["train", "new", "model=./no-model", "pool=mypack.yaml"], 2, ["'model'", "no-model"]),
    ("prices-nan", ["agg", RUNS, "--prices", "prices-nan.yaml"], 2, ["prices-nan.yaml", "agent.input"]),
    ("prices-negative", ["agg", RUNS, "--prices", "prices-neg.yaml"], 2, ["prices-neg.yaml", "agent.input"]),
    ("prices-text", ["agg", RUNS, "--prices", "prices-str.yaml"], 2, ["prices-str.yaml", "agent.input"]),
    ("prices-role", ["agg", RUNS, "--prices", "prices-role.yaml"], 2, ["prices-role.yaml", "agnet"]),
    ("bootstrap-negative", ["agg", RUNS, "--bootstrap", "-5"], 2, ["--bootstrap", "-5"]),
    ("slurm-parallelism", ["eval", "--out", "new", "slurm={array_parallelism: 0}"], 2, ["array_parallelism"]),
    ("slurm-mem", ["eval", "--out", "new", "slurm={mem: -5G}"], 2, ["'mem'", "-5G"]),
    ("slurm-time", ["eval", "--out", "new", "slurm={time: forever}"], 2, ["'time'", "forever"]),
    ("slurm-unknown", ["eval", "--out", "new", "slurm={partitoin: gpu}"], 2, ["'partitoin'"]),
    ("serve-tp", ["serve", "srv", "--dry-run", "model=folder", "tensor_parallel_size=0"], 2, ["tensor_parallel_size"]),
    ("serve-dtype", ["serve", "srv", "--dry-run", "model=folder", "dtype=float128"], 2, ["'dtype'", "float128"]),
    ("serve-port", ["serve", "srv", "--dry-run", "model=folder", "port=99999"], 2, ["'port'", "99999"]),
    ("serve-check-dead", ["serve-check", "--url", "http://127.0.0.1:9", "--checkpoint", "folder"], 2,
     ["http://127.0.0.1:9", "no vLLM server answers"]),
    ("submit-slurm-time", ["submit", "eval", "--out", "new", "--dry-run", "slurm={time: forever}"], 2, ["'time'"]),
    # 8. import-tb: exact types unless --lenient
    ("tb-yes", ["import-tb", "tb-yes.jsonl", "--out", "imp"], 2, ["tb-yes.jsonl: line 2", "test_result.result", '"yes"']),
    ("tb-int-uid", ["import-tb", "tb-intuid.jsonl", "--out", "imp"], 2, ["tb-intuid.jsonl: line 2", "'uid'", "5"]),
    ("tb-many", ["import-tb", "tb-many.jsonl", "--out", "imp"], 2, ["line 2", "input_tokens", '"many"']),
    ("tb-nan", ["import-tb", "tb-nan.jsonl", "--out", "imp"], 2, ["line 1", "input_tokens", "NaN"]),
    ("tb-negative", ["import-tb", "tb-neg.jsonl", "--out", "imp"], 2, ["line 2", "output_tokens", "-5"]),
    ("tb-float-tokens", ["import-tb", "tb-float.jsonl", "--out", "imp"], 2, ["line 2", "input_tokens", "2.5"]),
    ("tb-reward-text", ["import-tb", "tb-reward.jsonl", "--out", "imp"], 2, ["line 2", "test_result.reward"]),
    ("tb-sys-text", ["import-tb", "tb-sys.jsonl", "--out", "imp"], 2, ["line 2", "is_system_error", '"no"']),
    ("tb-not-json", ["import-tb", "tb-notjson.jsonl", "--out", "imp", "--lenient"], 2, ["tb-notjson.jsonl: line 1", "JSON"]),
    ("tb-missing-file", ["import-tb", "nothing.jsonl", "--out", "imp"], 2, ["nothing.jsonl"]),
    # 9. late or weak checks
    ("demo-train-typo", ["demo", "out=demo-new", "train.lrr=1e-4"], 2, ["'lrr'"]),
    ("demo-warm-missing", ["demo", "out=demo-new", "warm_start=models/demo-wram"], 2, ["warm_start", "models/demo-wram"]),
    ("validate-not-a-run", ["validate", "folder"], 2, ["folder", "not a run directory"]),
    ("show-missing-task", ["show", RUNS, "no-such-task"], 2, ["no-such-task"]),
    ("mcp-serve-domain", ["mcp-serve", "--domain", "retial"], 2, ["retial", "retail"]),
    ("tasks-list-domain", ["tasks", "list", "--domain", "retial"], 2, ["--domain", "retial", "retail"]),
    # 10. a run directory of another kind, and paths the file system cannot hold (issue 42)
    ("submit-dry-run-probe-as-eval", ["submit", "eval", "--out", "probe", "--dry-run", "limit=6", "repeats=4"], 2,
     ["probe", "kind probe, not eval"]),
    ("submit-dry-run-changed", ["submit", "eval", "--out", RUNS, "--dry-run", "limit=5", "repeats=2"], 2,
     [RUNS, "different campaign", "'limit'"]),
    ("submit-dry-run-train-on-eval", ["submit", "train", "--out", RUNS, "--dry-run", "model=folder", "pool=mypack.yaml"], 2,
     [RUNS, "kind 'eval', not 'train'"]),
    ("out-name-too-long", ["eval", "--out", "new/" + "x" * 300, "limit=1"], 2, ["--out", "300 characters", "255 bytes"]),
    ("report-name-too-long", ["report", RUNS, "--out", "x" * 300], 2, ["300 characters"]),
    ("demo-out-too-long", ["demo", "out=" + "x" * 300, "quick=true"], 2, ["'out'", "300 characters"]),
    ("pool-out-too-long", ["select", "probe", "--out", "x" * 300 + ".yaml"], 2, ["--out", "305 characters"]),
    ("unknown-command", ["evaluate"], 2, ["invalid choice: 'evaluate'"]),
    # 11. the sweep (issue 42): what a stage would refuse minutes later, refused before anything is written
    ("demo-pack-missing", ["demo", "out=demo-new", "pack=no-such-pack"], 2, ["no-such-pack", "no such pack"]),
    ("demo-prices-missing", ["demo", "out=demo-new", "prices=no-prices.yaml"], 2, ["no-prices.yaml", "price table"]),
    ("demo-prices-nan", ["demo", "out=demo-new", "prices=prices-nan.yaml"], 2, ["prices-nan.yaml", "agent.input"]),
    ("demo-tasks-missing", ["demo", "out=demo-new", "tasks=no-tasks.txt"], 2, ["no-tasks.txt", "task list"]),
    ("demo-limit-zero", ["demo", "out=demo-new", "limit=0"], 2, ["'limit'", ">= 1"]),
    ("user-unknown", ["eval", "--out", "new", "user=nosuch"], 2, ["'user'", "scripted or openai", "nosuch"]),
    ("judge-unknown", ["eval", "--out", "new", "judge=nosuch"], 2, ["'judge'", "keyword or openai", "nosuch"]),
    ("user-without-url", ["submit", "probe", "--out", "new", "--dry-run", "user=openai"], 2, ["'user'", "user_url"]),
    ("eval-kind-override", ["eval", "--out", "new", "kind=probe"], 2, ["kind: probe", "tbhpc probe"]),
    ("submit-kind-override", ["submit", "eval", "--out", "new", "--dry-run", "kind=probe"], 2, ["kind: probe"]),
    ("name-slash", ["eval", "--out", "new", "name=a/b"], 2, ["'name'", "Slurm", "'a/b'"]),
    ("tokens-no-server", ["eval", "--out", "new", "limit=1", "policy=tokens", "policy_opts={model_path: folder}"], 2,
     ["generator=server", "endpoint"]),
    ("tokens-no-model", ["eval", "--out", "new", "limit=1", "policy=tokens",
                         "policy_opts={model_path: no-model, generator: batched}"], 2, ["model_path", "'no-model'"]),
    ("tokens-generator", ["eval", "--out", "new", "limit=1", "policy=tokens", "policy_opts={generator: gpu}"], 2,
     ["generator", "'gpu'"]),
    ("hf-no-model", ["eval", "--out", "new", "limit=1", "policy=hf", "policy_opts={model_path: no-model}"], 2,
     ["model_path", "'no-model'"]),
    ("hf-folder-not-model", ["eval", "--out", "new", "limit=1", "policy=hf", "policy_opts={model_path: folder}"], 2,
     ["model_path", "'folder'", "no config.json"]),
    ("episode-hf-folder", ["episode", "--task", "TASK", "--policy", "hf", "--opt", "model_path=folder"], 2,
     ["model_path", "'folder'", "no config.json"]),
    ("episode-hf-unloadable", ["episode", "--task", "TASK", "--policy", "hf", "--opt", "model_path=not-hf"], 2,
     ["--policy hf", "cannot load", "'not-hf'"]),
    ("tokens-batched-folder", ["eval", "--out", "new", "limit=1", "policy=tokens",
                               "policy_opts={model_path: folder, generator: batched}"], 2, ["'folder'", "no config.json"]),
    ("episode-servers-missing", ["episode", "--task", "TASK", "--servers", "no.yaml"], 2, ["--servers", "no.yaml"]),
    ("serve-into-file", ["serve", "notes.txt", "--dry-run", "model=folder"], 2, ["notes.txt", "is a file"]),
    # the memory plan (issue 47)
    ("plan-no-config", ["plan", "nope.yaml"], 2, ["nope.yaml"]),
    ("plan-unknown-field", ["plan", "ref.yaml", "model=m27", "sp_sise=4"], 2, ["sp_sise"]),
    ("plan-sp-heads", ["plan", "ref.yaml", "model=m27", "sp_size=16"], 2, ["'sp_size'", "40 attention heads"]),
    ("plan-sp-ranks", ["plan", "ref.yaml", "model=m27", "sp_size=32"], 2, ["'sp_size'", "16 ranks"]),
    ("plan-no-model", ["plan", "ref.yaml", "model=folder"], 2, ["'model'", "config.json"]),
    ("plan-moe", ["plan", "ref.yaml", "model=moe"], 2, ["num_experts", "dense"]),
    ("plan-negative-gpu", ["plan", "ref.yaml", "model=m27", "gpu_memory_gb=-1"], 2, ["'gpu_memory_gb'"]),
    ("plan-too-small", ["plan", "ref.yaml", "model=m27", "gpu_memory_gb=40"], 2, ["does not fit", "change field '"]),
    ("plan-chunk-zero", ["plan", "ref.yaml", "model=m27", "logprob_chunk=0"], 2, ["'logprob_chunk'"]),
    ("doctor-no-config", ["doctor", "nope.yaml"], 2, ["nope.yaml"]),
    ("doctor-bad-env", ["doctor", "ref.yaml", "env={1X: a}"], 2, ["field 'env'", "'1X'"]),
    # 8. a command's own flags: checked before anything starts, as config fields are
    ("user-url-no-scheme", ["episode", "--task", "TASK", "--user", "openai", "--user-url", "localhost:8000/v1"], 2,
     ["--user-url", "http(s)://"]),
    ("judge-url-no-host", ["episode", "--task", "TASK", "--judge-url", "http://"], 2, ["--judge-url"]),
    ("episode-empty-pack", ["episode", "--task", "TASK", "--pack", ""], 2, ["--pack", "empty"]),
    ("tasks-empty-pack", ["tasks", "list", ""], 2, ["pack", "empty"]),
    ("export-domain-typo", ["tasks", "export-tb", "--out", "exp", "--domain", "retail", "--domain", "retial"], 2,
     ["--domain 'retial'", "retail"]),
    ("serve-empty-run", ["serve", ""], 2, ["empty path"]),
    ("select-empty-keep", ["select", "probe", "--out", "pool.yaml", "--keep", ""], 2, ["--keep", "empty"]),
    ("plan-rates-missing", ["plan", "ref.yaml", "model=m27", "--rates", "nope.yaml"], 2, ["--rates", "nope.yaml"]),
    ("prices-list", ["agg", "run", "--prices", "prices-list.yaml"], 2, ["prices-list.yaml", "mapping of roles"]),
    ("prices-flat", ["agg", "run", "--prices", "prices-flat.yaml"], 2, ["prices-flat.yaml", "agent"]),
    ("grad-noise-model", ["grad-noise", "train-run", "--model", "nope"], 2, ["--model", "'nope' does not exist"]),
    ("grad-noise-cfg-model", ["grad-noise", "train-run"], 2, ["field model", "no-such-model"]),
    ("warmstart-base", ["warmstart", "--out", "ws", "--split", "train", "--base", "folder"], 2, ["--base", "no config.json"]),
    ("warmstart-band", ["warmstart", "--out", "ws", "--split", "train", "--select", "--band", "0.9", "0.5"], 2,
     ["--band", "LO <= HI"]),
    ("warmstart-lr-zero", ["warmstart", "--out", "ws", "--split", "train", "--lr", "0"], 2, ["--lr", "> 0"]),
    ("warmstart-seed", ["warmstart", "--out", "ws", "--split", "train", "--seed", str(2**64)], 2, ["--seed"]),
    ("serve-check-url", ["serve-check", "--url", "localhost:8000"], 2, ["--url", "http(s)://"]),
    ("import-tb-empty-id", ["import-tb", "tb-yes.jsonl", "--out", "imp", "--policy-id", ""], 2, ["--policy-id", "empty"]),
]


@pytest.mark.parametrize("name, argv, code, needles", CASES, ids=[c[0] for c in CASES])
def test_hostile_input_is_one_line_and_changes_nothing(world, monkeypatch, capfd, tmp_path, name, argv, code, needles):
    from tbhpc.tasks.loader import load_pack
    argv = [load_pack(None)[0].id if a == "TASK" else a for a in argv]
    monkeypatch.chdir(world)
    monkeypatch.setenv("TBHPC_CRASH_DIR", str(tmp_path / "crashes"))
    monkeypatch.delenv("TBHPC_TRACEBACK", raising=False)
    before = _checksums(world)
    got = _main(argv)
    err = capfd.readouterr().err
    lines = [ln for ln in err.replace("\r", "\n").splitlines() if ln.strip()]
    assert got == code, f"{name}: exit {got}, stderr: {err[-1500:]}"
    assert "Traceback" not in err and not (tmp_path / "crashes").exists(), f"{name}: {err[-1500:]}"
    assert len(lines) == 1, f"{name}: {len(lines)} stderr lines: {err[-1500:]}"
    for needle in needles:
        assert needle in lines[0], f"{name}: {needle!r} not in {lines[0]!r}"
    assert _checksums(world) == before, f"{name}: files changed or appeared"


def test_the_world_has_enough_cases():
    assert len(CASES) >= 60 and len({c[0] for c in CASES}) == len(CASES)


def test_a_damaged_results_file_is_rebuilt_from_its_shards(world, tmp_path, monkeypatch, capfd):
    """The rebuild the damage line points to: the same attempts as before the damage."""
    import duckdb
    run = tmp_path / "damaged"
    shutil.copytree(world / "damaged", run)
    monkeypatch.chdir(tmp_path)
    assert _main(["merge", "damaged", "--rebuild"]) == 0
    assert _main(["validate", "damaged"]) == 0
    con = duckdb.connect(str(run / "results.duckdb"), read_only=True)
    rows = con.execute("SELECT count(*), count(DISTINCT (task_id, attempt_index)), sum(reward) FROM attempts").fetchone()
    con.close()
    assert rows[0] == rows[1] == 1200
    assert list(run.glob("results.duckdb.damaged-*")), "the damaged file is kept aside"


def test_every_read_only_results_connection_is_sealed(world):
    """Not only `tbhpc sql`'s: a read-only connection the project opens reads no other file and
    cannot unlock itself (validate and export, which read or write files, ask for it by name)."""
    import duckdb

    from tbhpc.store.merge import connect
    from tbhpc.store.run_dir import RunDir
    con = connect(RunDir(world / "run"), read_only=True)
    try:
        assert con.execute("SELECT count(*) FROM attempts").fetchone()[0] == 8
        with pytest.raises(duckdb.Error, match="disabled"):
            con.execute(f"SELECT * FROM read_text('{world / 'notes.txt'}')").fetchall()
        with pytest.raises(duckdb.Error, match="locked"):
            con.execute("SET enable_external_access = true")
    finally:
        con.close()
