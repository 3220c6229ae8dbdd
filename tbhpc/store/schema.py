"""The attempt row: one source of truth for shard files, the DuckDB tables and the views.

An attempt is identified by its key (campaign, task_id, attempt_index, policy_id). The key is
unique in `attempts` by construction (the merge is the only writer and replaces by key) and
checked by `tbhpc validate`; it is not a DuckDB PRIMARY KEY, because an index over four text
columns makes a million-row ingest about three times slower. Token counts are per model role
(agent, user, judge) and kind (in, cached, out, reasoning); `in` includes `cached` (OpenAI
convention).
"""
from __future__ import annotations

KEY = ("campaign", "task_id", "attempt_index", "policy_id")
ROLES = ("agent", "user", "judge")
TOKEN_KINDS = ("in", "cached", "out", "reasoning")

ATTEMPT_COLUMNS: dict[str, str] = {
    "campaign": "VARCHAR", "task_id": "VARCHAR", "attempt_index": "INTEGER", "policy_id": "VARCHAR",
    "domain": "VARCHAR", "reward": "DOUBLE", "passed": "BOOLEAN", "status": "VARCHAR", "finish_reason": "VARCHAR",
    "agent_turns": "INTEGER", "user_turns": "INTEGER", "tool_calls": "INTEGER", "tool_errors": "INTEGER",
    **{f"{r}_{k}": "BIGINT" for r in ROLES for k in TOKEN_KINDS},
    "wall_s": "DOUBLE", "host": "VARCHAR", "worker_pid": "INTEGER",
    "slurm_job_id": "VARCHAR", "slurm_array_job_id": "VARCHAR", "slurm_array_task_id": "VARCHAR",
    "started_at": "TIMESTAMP", "finished_at": "TIMESTAMP",
    "error": "VARCHAR", "error_kind": "VARCHAR", "final_hash": "VARCHAR", "golden_hash": "VARCHAR",
    "diff": "VARCHAR", "final_message": "VARCHAR",
    "train_step": "INTEGER", "policy_version": "VARCHAR",     # training rollouts only (NULL for probes and evals)
    # training rollouts only: the newest weights that sampled a token of the episode (policy_version is
    # the oldest), how often the version changed along it, turns issued again after a weight sync
    # interrupted them, and the tokens the server prefilled again for that
    "newest_version": "VARCHAR", "version_switches": "INTEGER", "reissued_turns": "INTEGER", "reprefilled_tokens": "BIGINT",
    "env_degraded": "VARCHAR",     # what the environment lacked for this attempt (e.g. no_policy_search); NULL: nothing
    "rubrics_skipped": "INTEGER",  # yes/no rubrics left ungraded (rubrics=skip); NULL: every rubric was judged
    "transcript": "VARCHAR",       # the conversation (tbhpc.store.transcripts; system prompt and tools in `blobs`)
    "shard": "VARCHAR",
}
SHARD_COLUMNS = {k: v for k, v in ATTEMPT_COLUMNS.items() if k != "shard"}  # `shard` is added at merge


def task_stats_sql(per_run: bool = False) -> str:
    """The `task_stats` view's query: per task and policy, attempts (n_rows), clean ones (n), passes
    (c) and system errors. `per_run`: over the catalogue's union views, keyed by their `run` too
    (a run's own view cannot be reused there: DuckDB binds its `attempts` to the union view)."""
    run, on = ("a.run, ", "t.run = a.run AND ") if per_run else ("", "")
    return f"""
SELECT {run}a.campaign, a.policy_id, a.task_id, any_value(coalesce(t.domain, a.domain)) AS domain,
       count(*) AS n_rows,
       count(*) FILTER (WHERE a.status = 'ok') AS n,
       count(*) FILTER (WHERE a.status = 'ok' AND a.passed) AS c,
       count(*) FILTER (WHERE a.status = 'system_error') AS system_errors
FROM attempts a LEFT JOIN tasks t ON {on}t.campaign = a.campaign AND t.task_id = a.task_id
GROUP BY {run}a.campaign, a.policy_id, a.task_id"""


DDL = f"""
CREATE TABLE IF NOT EXISTS campaigns (
    campaign VARCHAR PRIMARY KEY, kind VARCHAR, policy_id VARCHAR, config_hash VARCHAR,
    config JSON, created_at TIMESTAMP, source VARCHAR);
CREATE TABLE IF NOT EXISTS tasks (
    campaign VARCHAR, task_id VARCHAR, domain VARCHAR, split VARCHAR, n_golden_calls INTEGER,
    tags VARCHAR[], template VARCHAR);
CREATE TABLE IF NOT EXISTS plan (campaign VARCHAR, task_id VARCHAR, policy_id VARCHAR, repeats INTEGER);
CREATE TABLE IF NOT EXISTS attempts (
    {", ".join(f"{c} {t}" for c, t in ATTEMPT_COLUMNS.items())});
ALTER TABLE attempts ADD COLUMN IF NOT EXISTS train_step INTEGER;
ALTER TABLE attempts ADD COLUMN IF NOT EXISTS policy_version VARCHAR;
ALTER TABLE attempts ADD COLUMN IF NOT EXISTS env_degraded VARCHAR;
ALTER TABLE attempts ADD COLUMN IF NOT EXISTS transcript VARCHAR;
ALTER TABLE attempts ADD COLUMN IF NOT EXISTS rubrics_skipped INTEGER;
ALTER TABLE attempts ADD COLUMN IF NOT EXISTS newest_version VARCHAR;
ALTER TABLE attempts ADD COLUMN IF NOT EXISTS version_switches INTEGER;
ALTER TABLE attempts ADD COLUMN IF NOT EXISTS reissued_turns INTEGER;
ALTER TABLE attempts ADD COLUMN IF NOT EXISTS reprefilled_tokens BIGINT;
CREATE TABLE IF NOT EXISTS blobs (ref VARCHAR PRIMARY KEY, content VARCHAR);
CREATE TABLE IF NOT EXISTS merged_shards (shard VARCHAR PRIMARY KEY, rows INTEGER, merged_at TIMESTAMP);
CREATE TABLE IF NOT EXISTS quarantined_shards (shard VARCHAR PRIMARY KEY, error VARCHAR, quarantined_at TIMESTAMP);
CREATE OR REPLACE VIEW task_stats AS {task_stats_sql()};
"""
