"""The merge's first-merge path (straight into `attempts`) and its fallback to the staged path:
duplicate keys and corrupt shards in a run's first merge are handled as in any later merge."""
import duckdb

from tbhpc.store.merge import merge
from tbhpc.store.run_dir import RunDir
from tbhpc.store.shards import write_shard


def _run(tmp_path) -> RunDir:
    run = RunDir(tmp_path / "run")
    run.create({"name": "m"}, "h", {"campaign": "m", "kind": "eval", "policy_id": "p"},
               [{"task_id": f"t{i}", "domain": "retail", "split": "eval", "n_golden_calls": 1, "tags": [],
                 "template": "x", "repeats": 2} for i in range(3)])
    return run


def _row(task: str, index: int, status: str = "ok", passed: bool = True, at: str = "2026-01-01 00:00:00") -> dict:
    return {"campaign": "m", "task_id": task, "attempt_index": index, "policy_id": "p", "domain": "retail",
            "status": status, "passed": passed if status == "ok" else None,
            "reward": (1.0 if passed else 0.0) if status == "ok" else None, "finished_at": at}


def _rows(run: RunDir):
    return duckdb.connect(str(run.db), read_only=True).execute(
        "SELECT task_id, attempt_index, status, passed FROM attempts ORDER BY 1, 2").fetchall()


def test_a_clean_first_merge_lands_whole_and_a_second_changes_nothing(tmp_path):
    run = _run(tmp_path)
    write_shard(run.shards, [_row("t0", 0), _row("t0", 1, passed=False)], name="a.jsonl")
    write_shard(run.shards, [_row("t1", 0), _row("t1", 1)], name="b.jsonl")
    rep = merge(run)
    assert rep.new_shards == 2 and rep.rows == 4 and not rep.quarantined
    con = duckdb.connect(str(run.db), read_only=True)
    assert con.execute("SELECT shard, rows FROM merged_shards ORDER BY 1").fetchall() == [("a.jsonl", 2), ("b.jsonl", 2)]
    assert con.execute("SELECT count(*) FROM tasks").fetchone()[0] == 3
    con.close()
    before = _rows(run)
    assert merge(run).new_shards == 0 and _rows(run) == before


def test_duplicate_keys_in_a_first_merge_keep_the_ok_result(tmp_path):
    run = _run(tmp_path)
    write_shard(run.shards, [_row("t0", 0, passed=True)], name="a.jsonl")
    write_shard(run.shards, [_row("t0", 0, status="system_error", at="2026-01-02 00:00:00"), _row("t2", 1)],
                name="b.jsonl")
    rep = merge(run)
    assert rep.new_shards == 2 and _rows(run) == [("t0", 0, "ok", True), ("t2", 1, "ok", True)]


def test_a_corrupt_shard_in_a_first_merge_is_quarantined_and_the_rest_lands(tmp_path):
    run = _run(tmp_path)
    write_shard(run.shards, [_row("t0", 0), _row("t1", 0)], name="a.jsonl")
    (run.shards / "b.jsonl").write_text('{"campaign": "m", "task_id": "t2", "attempt_ind')
    rep = merge(run)
    assert [name for name, _ in rep.quarantined] == ["b.jsonl"] and (run.quarantine / "b.jsonl").exists()
    assert _rows(run) == [("t0", 0, "ok", True), ("t1", 0, "ok", True)]


def test_a_shard_with_an_unknown_status_or_no_key_in_a_first_merge_is_quarantined(tmp_path):
    run = _run(tmp_path)
    write_shard(run.shards, [_row("t0", 0), _row("t1", 0)], name="a.jsonl")
    write_shard(run.shards, [_row("t2", 0, status="done")], name="b.jsonl")
    write_shard(run.shards, [{**_row("t2", 1), "attempt_index": None}], name="c.jsonl")
    rep = merge(run)
    assert sorted(name for name, _ in rep.quarantined) == ["b.jsonl", "c.jsonl"]
    assert all("without a full attempt key or with an unknown status" in why for _, why in rep.quarantined)
    assert _rows(run) == [("t0", 0, "ok", True), ("t1", 0, "ok", True)]


def test_running_out_of_memory_stops_the_merge_and_quarantines_nothing(tmp_path, monkeypatch):
    import pytest

    import tbhpc.store.merge as merge_module
    from tbhpc.errors import InfraError
    run = _run(tmp_path)
    write_shard(run.shards, [_row(f"t{i % 3}", i) for i in range(200)], name="a.jsonl")
    monkeypatch.setattr(merge_module, "MERGE_MEMORY", "1MB")      # less than one JSON read buffer
    with pytest.raises(InfraError, match="nothing was merged or quarantined.*Out of Memory"):
        merge(run)
    assert (run.shards / "a.jsonl").exists() and not run.quarantine.exists()
    monkeypatch.undo()
    rep = merge(run)
    assert rep.rows == 200 and not rep.quarantined


def test_a_row_longer_than_a_shard_line_keeps_all_but_its_messages(tmp_path, monkeypatch):
    import json

    import tbhpc.store.shards as shards
    from tbhpc.store.attempts import read_attempt
    from tbhpc.store.transcripts import compact
    monkeypatch.setattr(shards, "MAX_SHARD_LINE", 4096)
    run = _run(tmp_path)
    long = compact([{"role": "system", "content": "s"}, {"role": "user", "content": "x" * 5000}], [], "done",
                   [{"question": "q", "yes": True}], None)
    short = compact([{"role": "user", "content": "hello"}], [], "done", [], None)
    write_shard(run.shards, [{**_row("t0", 0), "transcript": long}, {**_row("t1", 0), "transcript": short}])
    assert max(len(line) for line in next(run.shards.glob("*.jsonl")).read_text().splitlines()) <= 4096
    merge(run)
    kept = read_attempt(run.db, "t0", 0)
    assert kept["status"] == "ok" and kept["passed"] is True
    assert kept["transcript"]["finish"] == "done" and kept["transcript"]["judge"] == [{"question": "q", "yes": True}]
    note = kept["transcript"]["messages"]
    assert [m["role"] for m in note] == ["system", "note"] and "1 message (" in note[1]["content"]
    assert "4,096 bytes" in note[1]["content"]
    assert read_attempt(run.db, "t1", 0)["transcript"]["messages"] == json.loads(short)["messages"]


def test_shards_of_kilobyte_rows_merge_on_one_thread(tmp_path):
    """Two threads each hold a partial row group of transcripts and overflow the merge's budget."""
    from tbhpc.store.merge import _threads_for
    small = write_shard(tmp_path / "a", [_row(f"t{i}", i) for i in range(50)])
    big = write_shard(tmp_path / "b", [{**_row(f"t{i}", i), "transcript": "x" * 3000} for i in range(50)])
    assert _threads_for([small]) == 2 and _threads_for([big]) == 1 and _threads_for([]) == 2
