"""`tbhpc select`: probe run -> pool file (+ manifest + a DuckDB table).

Order of gates (as the published recipe): 1) benchmark exclusion by id, applied before anything
and asserted again on the output; 2) minimum clean runs; 3) kept bands; 4) optional reference
gate: a second probe run (e.g. a stronger policy) must solve the task at least m times in at
least r clean runs.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import yaml

from tbhpc.errors import UserError
from tbhpc.metrics.agg import Counts, load_counts
from tbhpc.selection.bands import BAND_NAMES, DEFAULT_KEEP, assign
from tbhpc.store.merge import connect, insert_rows
from tbhpc.store.run_dir import RunDir
from tbhpc.tasks.loader import load_exclusions


@dataclass
class SelectConfig:
    keep: list[str] = field(default_factory=lambda: list(DEFAULT_KEEP))  # the bands kept in the pool
    min_clean_runs: int = 3               # a task needs this many clean probe attempts to be banded
    exclude: list[str] = field(default_factory=list)      # exclusion list files (ids one per line)
    reference: str | None = None                            # reference probe run directory
    reference_min_successes: int = 1                        # solvability gate: passes the reference policy needs
    reference_min_clean_runs: int = 4                       # solvability gate: clean reference attempts it needs

    def __post_init__(self) -> None:
        bad = [b for b in self.keep if b not in BAND_NAMES]
        if bad:
            raise UserError(f"select: unknown band {bad[0]!r} (bands: {', '.join(BAND_NAMES)})")


@dataclass
class Selection:
    pool: list[str]
    rows: list[dict]               # every probed task: id, domain, n, c, band, masses, kept, reason
    band_counts: dict[str, int]
    excluded: int


def select(counts: Counts, cfg: SelectConfig, excluded_ids: set[str], reference: Counts | None = None) -> Selection:
    keep_mask = np.array([t not in excluded_ids for t in counts.task_ids.tolist()], dtype=bool)
    ids, doms, n, c = counts.task_ids[keep_mask], counts.domains[keep_mask], counts.n[keep_mask], counts.c[keep_mask]
    band_idx, masses = assign(c, n)
    ref = {}
    if reference is not None:
        ref = {t: (int(rn), int(rc)) for t, rn, rc in zip(reference.task_ids.tolist(), reference.n, reference.c)}
    rows, pool = [], []
    for i, tid in enumerate(ids.tolist()):
        band = BAND_NAMES[band_idx[i]]
        reason = "kept"
        if n[i] < cfg.min_clean_runs:
            reason = f"fewer than {cfg.min_clean_runs} clean runs"
        elif band not in cfg.keep:
            reason = f"band {band} not kept"
        elif reference is not None:
            rn, rc = ref.get(tid, (0, 0))
            if rn < cfg.reference_min_clean_runs or rc < cfg.reference_min_successes:
                reason = f"reference gate ({rc}/{rn})"
        rows.append({"id": tid, "domain": str(doms[i]), "n": int(n[i]), "c": int(c[i]), "band": band,
                     "masses": {b: round(float(m), 6) for b, m in zip(BAND_NAMES, masses[i])},
                     "kept": reason == "kept", "reason": reason})
        if reason == "kept":
            pool.append(tid)
    leaked = set(pool) & excluded_ids
    assert not leaked, f"excluded ids in the pool: {sorted(leaked)[:3]}"  # the recipe's final assertion
    counts_by_band = {b: int((band_idx == i).sum()) for i, b in enumerate(BAND_NAMES)}
    return Selection(pool, rows, counts_by_band, int((~keep_mask).sum()))


def is_pool_file(path: Path) -> bool:
    """A pool `run_select` wrote (so re-running select may replace it): its four keys, nothing else."""
    try:
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False
    return isinstance(doc, dict) and set(doc) == {"pool", "source", "tasks", "details"}


def default_exclusions(run: RunDir) -> list[str]:
    """Without exclusion lists: the probed pack's held-out ids (`eval_ids.txt`); a tb: source has none."""
    from tbhpc.tasks.select import pack_source
    camp = run.campaign()
    pack = pack_source(camp["config"].get("pack")) if camp.get("source") == "tbhpc" else None
    default = pack / "eval_ids.txt" if isinstance(pack, Path) else None
    return [str(default)] if default is not None and default.exists() else []


def select_pool(probe: Path, out: Path, cfg: SelectConfig, force: bool = False, default_exclude: bool = True) -> Selection:
    """`tbhpc select` (and the API's): both output files checked before anything is written; with no
    exclusion list, the probed pack's held-out ids (`default_exclusions`)."""
    from tbhpc.outpaths import check_output_file
    if default_exclude and not cfg.exclude:
        cfg = dataclasses.replace(cfg, exclude=default_exclusions(RunDir(probe).require()))
    check_output_file(out, is_pool_file, force=force)
    check_output_file(out.with_suffix(".manifest.json"), lambda p: is_pool_file(out), force=force)
    return run_select(probe, out, cfg)


def run_select(probe: Path, out: Path, cfg: SelectConfig) -> Selection:
    run = RunDir(probe).require()
    counts = load_counts(run)
    excluded: set[str] = set()
    for f in cfg.exclude:
        excluded |= load_exclusions(f)
    reference = load_counts(RunDir(Path(cfg.reference)).require()) if cfg.reference else None
    sel = select(counts, cfg, excluded, reference)
    pool_doc = {"pool": out.stem, "source": str(probe), "tasks": sel.pool,
                "details": [{k: r[k] for k in ("id", "domain", "band", "n", "c")} for r in sel.rows if r["kept"]]}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.safe_dump(pool_doc, sort_keys=False), encoding="utf-8")
    manifest = {
        "created_at": datetime.now(timezone.utc).isoformat(), "probe_run": str(probe),
        "inputs": {"probe_counts_sha256": _counts_hash(counts),
                   "exclusion_files": {f: _file_hash(f) for f in cfg.exclude},
                   **({"reference_counts_sha256": _counts_hash(reference)} if reference else {})},
        "config": asdict(cfg), "band_counts": sel.band_counts, "excluded_before_selection": sel.excluded,
        "pool_size": len(sel.pool), "probed_tasks": int(counts.task_ids.size),
    }
    out.with_suffix(".manifest.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    _store(run, out.stem, sel)
    return sel


def _store(run: RunDir, name: str, sel: Selection) -> None:
    with run.lock():
        con = connect(run)
        try:
            con.execute("""CREATE TABLE IF NOT EXISTS selections (
                selection VARCHAR, task_id VARCHAR, domain VARCHAR, n INTEGER, c INTEGER, band VARCHAR,
                kept BOOLEAN, reason VARCHAR, masses JSON, PRIMARY KEY (selection, task_id))""")
            con.execute("DELETE FROM selections WHERE selection = ?", [name])
            insert_rows(con, "selections",
                        [{"selection": name, "task_id": r["id"], "domain": r["domain"], "n": r["n"], "c": r["c"],
                          "band": r["band"], "kept": r["kept"], "reason": r["reason"], "masses": json.dumps(r["masses"])}
                         for r in sel.rows],
                        {"selection": "VARCHAR", "task_id": "VARCHAR", "domain": "VARCHAR", "n": "INTEGER", "c": "INTEGER",
                         "band": "VARCHAR", "kept": "BOOLEAN", "reason": "VARCHAR", "masses": "JSON"})
        finally:
            con.close()


def _counts_hash(counts: Counts) -> str:
    h = hashlib.sha256()
    for t, n, c in zip(counts.task_ids.tolist(), counts.n.tolist(), counts.c.tolist()):
        h.update(f"{t}:{n}:{c}\n".encode())
    return h.hexdigest()


def _file_hash(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
