"""Store package: the attempt-row schema, atomic shard files, the merge into `results.duckdb`, and run
directories. It never runs episodes.

Why shards + one merge: many workers (processes, Slurm array tasks, MPI ranks) finish attempts at
once; DuckDB allows one writer per file. So each worker writes its own shard file atomically
(temp file + rename: a shard is whole or absent), and a single merge step loads them all.
"""
