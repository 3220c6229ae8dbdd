"""What storing transcripts costs: bytes per attempt and campaign throughput, on against off.

The bundled eval split (134 tasks) x N repeats with the noisy oracle that asks the user (so
conversations have user turns, tool errors and failures), one local worker, twice: with
`transcripts=true` and `transcripts=false`. Prints attempts/s, shard bytes and results.duckdb
bytes per attempt for both, and the ratios. The system prompt and tool schemas are stored once
per run (`blobs/`), not per attempt.

Usage: python bench/transcripts.py [--repeats 10]
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import duckdb
from rich.console import Console
from rich.table import Table

from tbhpc.campaign.config import CampaignConfig
from tbhpc.campaign.runner import run_campaign


def measure(out: Path, on: bool, repeats: int) -> dict:
    cfg = CampaignConfig(name="bench", split="eval", repeats=repeats, transcripts=on, chunk_size=64,
                         policy_opts={"skill": 0.8, "ask": True})
    t0 = time.perf_counter()
    res = run_campaign(cfg, out, console=Console(quiet=True))
    wall = time.perf_counter() - t0
    n = res.planned
    con = duckdb.connect(str(out / "results.duckdb"), read_only=True)
    chars = con.execute("SELECT coalesce(sum(length(transcript)), 0) FROM attempts").fetchone()[0]
    con.close()
    shards = sum(p.stat().st_size for p in (out / "shards").glob("*.jsonl"))
    blobs = sum(p.stat().st_size for p in (out / "blobs").glob("*.json")) if (out / "blobs").exists() else 0
    return {"n": n, "rate": n / wall, "shard_b": shards / n, "db_b": (out / "results.duckdb").stat().st_size / n,
            "json_chars": chars / n, "blobs": blobs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="tbhpc-transcripts-"))
    measure(root / "warm", True, 1)                               # imports, templates, golden caches
    rounds = [(measure(root / f"off{i}", False, args.repeats), measure(root / f"on{i}", True, args.repeats)) for i in range(2)]
    off = max((r[0] for r in rounds), key=lambda m: m["rate"])    # the faster of two alternated rounds each
    on = max((r[1] for r in rounds), key=lambda m: m["rate"])
    t = Table(title=f"transcripts: {on['n']} oracle attempts (134 eval tasks x {args.repeats}), one worker, "
                    "best of two alternated rounds")
    for col in ("", "transcripts off", "transcripts on", "on / off"):
        t.add_column(col, justify="right" if col else "left")
    t.add_row("attempts / s", f"{off['rate']:.0f}", f"{on['rate']:.0f}", f"{on['rate'] / off['rate']:.2f}")
    t.add_row("shard bytes / attempt", f"{off['shard_b']:.0f}", f"{on['shard_b']:.0f}", f"{on['shard_b'] / off['shard_b']:.2f}")
    t.add_row("results.duckdb bytes / attempt", f"{off['db_b']:.0f}", f"{on['db_b']:.0f}", f"{on['db_b'] / off['db_b']:.2f}")
    t.add_row("transcript JSON chars / attempt", "-", f"{on['json_chars']:.0f}", "")
    t.add_row("blobs (system prompts + tool lists, once per run)", "-", f"{on['blobs'] / 1024:.0f} KiB", "")
    Console().print(t)


if __name__ == "__main__":
    main()
