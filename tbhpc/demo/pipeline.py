"""`make demo`: the published recipe end to end on one machine, with a model that learns.

start (committed, or built once) -> probe candidates (n per task) -> Jeffreys pool (eval ids
excluded) -> GRPO (the trainer of `make train`, DeepSpeed on CPU, one rank) -> the baselines for
the same wall time from the same start (RFT through the same trainer, `algorithm: rft`; SFT on
oracle demonstrations: demo/baseline.py) -> evaluate every model on the held-out split (and on
fresh instances) -> Table 1, the paired comparison, per-domain and per-task-type tables, plots.
Every stage runs the same code a cluster runs (campaigns, select, `tbhpc train`), on the local
executor, and every stage resumes: a second `make demo` reuses what is done.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import yaml
from rich.console import Console

from tbhpc.campaign.config import CampaignConfig, campaign_tasks
from tbhpc.campaign.runner import run_campaign
from tbhpc.config import config_hash
from tbhpc.demo.baseline import grpo_seconds, sft_baseline
from tbhpc.demo.config import DemoConfig
from tbhpc.errors import UserError
from tbhpc.selection.pool import SelectConfig, run_select
from tbhpc.tasks.loader import resolve_pack
from tbhpc.tasks.select import select_tasks

# The demo's GRPO run: the recipe's shape (groups of 8, zero-variance replacement, token mean, no
# KL) on a budget a 2-core machine finishes in ~17 minutes. lr 5e-5: at 2e-4 the demo model's
# samples got noisier every step (mean NLL of its own tokens 0.16 -> 0.39 in 9 steps) and its
# reward fell below the probe's; at 5e-5 it holds (docs/measurements/demo-history.md, "What GRPO did to the demo model").
# Any field can be overridden: train.lr=...
TRAIN_DEFAULTS = dict(steps=24, group_size=8, groups_per_step=4, max_draws=16, lr=5e-5, generator="batched",
                      episodes_in_flight=32, zero_stage=3, microbatch_tokens=8192, torch_threads=2,
                      checkpoint_every=1, keep_checkpoints=1, keep_published=1, nodes=1, gpus_per_node=0)


def eval_ids_file(pack: str | None) -> list[str]:
    root = resolve_pack(pack)
    root = root if root.is_dir() else root.parent
    return [str(root / "eval_ids.txt")] if (root / "eval_ids.txt").exists() else []


def policy_opts(cfg: DemoConfig, model_path: str) -> dict:
    return {"model_path": model_path, "generator": "batched", "max_tokens": cfg.max_tokens,
            "response_budget": cfg.response_budget, "temperature": cfg.temperature, "threads": 1}


def campaign(cfg: DemoConfig, name: str, kind: str, split: str, repeats: int, model_path: str) -> CampaignConfig:
    tasks = cfg.tasks if split == "train" else None
    if cfg.sample:
        tasks = str(sample_file(cfg, split))
    pack = train_pack(cfg) if split == "train" else cfg.pack
    return CampaignConfig(name=name, kind=kind, split=split, repeats=repeats, pack=pack, limit=cfg.limit,
                          tasks=tasks,
                          seed=cfg.seed, policy="tokens", policy_opts=policy_opts(cfg, model_path),
                          workers=cfg.workers, concurrency=cfg.concurrency, chunk_size=2 * cfg.concurrency)


def sample_file(cfg: DemoConfig, split: str) -> Path:
    """`sample` tasks of `split`, evenly spaced over the split's id order (so every domain and most
    templates are in it), written once to the demo's directory as an id list."""
    path = Path(cfg.out) / f"sample-{split}.txt"
    if not path.exists():
        pack = train_pack(cfg) if split == "train" else cfg.pack
        ids = [t.id for t in select_tasks(pack, split=split, limit=cfg.limit)]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(i + "\n" for i in evenly_spaced(ids, cfg.sample)), encoding="utf-8")
    return path


def train_pack(cfg: DemoConfig) -> str | None:
    """Where the probe, the pool and training draw their tasks: the pack's train split, or with
    `candidates_seed` the candidate instances (write_candidates; not in quick mode, which has no model
    that was trained on anything)."""
    return cfg.pack if cfg.candidates_seed is None or cfg.quick else str(candidates_path(cfg))


def candidates_path(cfg: DemoConfig) -> Path:
    return Path(cfg.out) / f"candidates-s{cfg.candidates_seed}-x{cfg.candidates_per_template}"


def write_candidates(cfg: DemoConfig) -> Path:
    """Train instances of the demo pack's templates drawn with `candidates_seed`, none of them equal to
    an instance of the bundled pack (written once; the same bytes every time). Why: the SFT plateau
    learnt the bundled train split, so probing it measures what SFT memorised (the plateau solves
    ~97% of its neobank/dispute instances and ~84% of fresh ones); the recipe probes tasks the
    policy was not trained on, and so does the demo with this."""
    from tbhpc.domains.demo.pack import DEMO_SEED, write_demo_pack
    path = candidates_path(cfg)
    if not (path / "eval_ids.txt").exists():
        tmp = path.with_name(path.name + ".tmp")
        write_demo_pack(tmp, seed=cfg.candidates_seed, train=cfg.candidates_per_template, eval=0, avoid_seed=DEMO_SEED)
        tmp.replace(path)
    return path


def evenly_spaced(ids: list[str], n: int) -> list[str]:
    """`n` of `ids` (all of them if fewer), evenly spaced over their order."""
    n = min(n, len(ids))
    return [ids[i * len(ids) // n] for i in range(n)]


def train_config(cfg: DemoConfig, out: Path, warm: str) -> dict:
    doc = {"name": "demo-train", "model": warm, "pool": str(out / "pool.yaml"), "exclude": eval_ids_file(cfg.pack),
           "pack": train_pack(cfg), "seed": cfg.seed, "max_tokens": cfg.max_tokens, "response_budget": cfg.response_budget,
           "temperature": cfg.temperature, **TRAIN_DEFAULTS, **cfg.train}
    doc["export_every"] = doc["steps"]
    doc["keep_published"] = max(doc["keep_published"], int(doc.get("max_staleness") or 0) + 1)   # off-policy resumes
    return doc


BASELINE_NAMES = {"rft": "RFT (fine-tuning on its own passed episodes: the same checks)",
                  "sft": "SFT on oracle demonstrations (which the checks do not give you)"}


def rft_config(tcfg: dict, seconds: float) -> dict:
    """The RFT run: GRPO's config (pool, draws, rollouts, lr, engine) with `algorithm: rft`, ended by
    GRPO's measured wall time (the run stops after the step that reaches it, as GRPO's did)."""
    return {**tcfg, "name": "demo-rft", "algorithm": "rft", "max_seconds": round(seconds, 1)}


def ensure_warm_start(cfg: DemoConfig, console: Console) -> str:
    """The warm start (committed for the demo model); built with the model's warm-start recipe
    (`tbhpc warmstart --recipe demo|smollm2`) if missing."""
    warm = Path(cfg.warm_path)
    if (warm / "config.json").exists():
        console.print(f"   warm start: {warm} (cached)")
        return str(warm)
    check_warm_start(cfg)
    if cfg.pack not in (None, "full", "demo"):
        raise UserError(f"demo: no warm start at {warm}; the demo recipes learn a bundled pack "
                        f"(for {cfg.pack}: tbhpc warmstart --size demo-pack --pack {cfg.pack} --split train --select ..., "
                        "then warm_start=DIR)")
    console.print(f"   warm start: building {warm} (SFT on oracle episodes of the train split; cached afterwards)")
    recipe = {"tiny": f"demo-pack{'-plateau' if cfg.start == 'plateau' else ''}" if cfg.pack == "demo" else "demo"}.get(
        cfg.model, cfg.model)
    recipe += "-demo-pack" if cfg.model != "tiny" and cfg.pack == "demo" else ""
    cmd = [sys.executable, "-m", "tbhpc.cli", "warmstart", "--recipe", recipe, "--out", str(warm), "--seed", str(cfg.seed)]
    _stream(cmd, console)
    return str(warm)


def check_warm_start(cfg: DemoConfig) -> None:
    """A warm start the user named is used, never built (a typo must not cost a 20-minute build)."""
    warm = Path(cfg.warm_path)
    if cfg.warm_start and not (warm / "config.json").exists():
        what = "holds no model (no config.json)" if warm.exists() else "does not exist"
        raise UserError(f"demo config: field 'warm_start': {warm} {what}; build one with `tbhpc warmstart "
                        f"--out {warm} ...`, or leave warm_start empty for the default")


def check_train_section(cfg: DemoConfig) -> None:
    """`train.*` checked as the trainer will check it, before the first stage (a typo found after
    the probe would cost its minutes): names, types and ranges, with placeholder paths."""
    from tbhpc.config import from_dict
    from tbhpc.train.config import TrainConfig
    doc = train_config(cfg, Path(cfg.out), cfg.warm_path)
    from_dict(TrainConfig, doc, {k: f"demo config: train.{k}" for k in doc})


def run_demo(cfg: DemoConfig, console: Console) -> int:
    check_train_section(cfg)
    check_warm_start(cfg)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    t0, times = time.perf_counter(), {}
    console.rule(f"tbhpc demo (config {config_hash(cfg)}) -> {out}")

    def stage(name: str, since: float) -> None:
        times[name] = round(time.perf_counter() - since, 1)
        console.print(f"   [dim]{name}: {times[name]} s[/]")

    s = time.perf_counter()
    model = "the demo model" if cfg.model == "tiny" else "SmolLM2-135M-Instruct"
    how = ("fine-tuned on demonstrations until held-out pass@1 stopped rising (the plateau)" if cfg.start == "plateau"
           else "warm-started on the train split" + (" until it passes about 60% of held-out tasks (the base)"
                                                     if cfg.pack == "demo" and cfg.model == "tiny" else ""))
    console.print(f"[bold]1. policy[/]: {model}, {how}")
    warm = ensure_warm_start(cfg, console)
    if cfg.pack == "demo":
        from transformers import AutoTokenizer

        from tbhpc.demo.pack_checks import oracle_episode_tokens
        sample = select_tasks(cfg.pack, split="train")[::40]
        stats = oracle_episode_tokens(AutoTokenizer.from_pretrained(warm), sample)
        console.print(f"   demo pack: an oracle episode is {stats['median']:.0f} tokens (median of {stats['episodes']}; "
                      f"max {stats['max']:.0f}) with this model's tokenizer")
    stage("warm start", s)

    s = time.perf_counter()
    if cfg.candidates_seed is None:
        console.print(f"[bold]2. probe[/] the warm start on the train split (n = {cfg.probe_repeats})")
    else:
        candidates = write_candidates(cfg)
        console.print(f"[bold]2. probe[/] the warm start (n = {cfg.probe_repeats}) on {cfg.candidates_per_template} candidate "
                      f"instances per template it never trained on ({candidates})")
    probe_cfg = campaign(cfg, "probe", "probe", "train", cfg.probe_repeats, warm)
    held_out = [t.id for t in campaign_tasks(probe_cfg) if t.split != "train"]
    if held_out:
        raise UserError(f"demo: field 'tasks' ({cfg.tasks}) holds {len(held_out)} task(s) outside the train split, "
                        f"e.g. {held_out[0]!r}")
    run_campaign(probe_cfg, out / "probe", console=console)
    stage("probe", s)

    s = time.perf_counter()
    console.print("[bold]3. select[/] the policy-relative pool (Jeffreys bands; eval ids excluded)")
    sel = run_select(out / "probe", out / "pool.yaml", SelectConfig(exclude=eval_ids_file(cfg.pack)))
    console.print("   bands: " + ", ".join(f"{b} {n}" for b, n in sel.band_counts.items()) + f"; pool {len(sel.pool)} tasks")
    if not sel.pool:
        raise UserError(f"demo: the pool is empty (every probed task is too easy or too hard for {warm})")
    stage("select", s)

    s = time.perf_counter()
    tcfg = train_config(cfg, out, warm)
    console.print(f"[bold]4. train[/] GRPO: {tcfg['steps']} steps x {tcfg['groups_per_step']} groups of "
                  f"{tcfg['group_size']}, lr {tcfg['lr']} (DeepSpeed ZeRO-{tcfg['zero_stage']} on CPU)")
    trained = run_training(tcfg, out / "train", console)
    stage("train", s)

    policies = [("eval-warm", warm), ("eval-trained", trained)]
    if cfg.baselines:
        s = time.perf_counter()
        seconds = grpo_seconds(out / "train")
        console.print(f"[bold]4b. baselines[/] from the same start for GRPO's {seconds:.0f} s: "
                      + ", ".join(BASELINE_NAMES[b] for b in cfg.baselines))
        for b in cfg.baselines:
            if b == "rft":
                policies.append(("eval-rft", run_training(rft_config(tcfg, seconds), out / "rft", console)))
            else:
                policies.append(("eval-sft", sft_baseline(out, warm, out / "pool.yaml", float(tcfg["lr"]), seconds,
                                                          int(tcfg["seed"]), console, _stream, tcfg["pack"],
                                                          demo_pack=cfg.pack == "demo")))
        stage("baselines", s)

    s = time.perf_counter()
    console.print(f"[bold]5. evaluate[/] {', '.join(n[5:] for n, _ in policies)} on the held-out eval split x {cfg.eval_repeats}")
    for name, path in policies:
        run_campaign(campaign(cfg, name, "eval", "eval", cfg.eval_repeats, path), out / name, console=console)
    stage("evaluate", s)

    if cfg.fresh_seed is not None:
        s = time.perf_counter()
        fresh = fresh_pack(cfg, out)
        console.print(f"[bold]5b. fresh instances[/]: the same templates drawn with seed {cfg.fresh_seed} after training "
                      f"({fresh}), eval split x {cfg.fresh_repeats}")
        for name, path in policies:
            fcfg = campaign(cfg, name.replace("eval-", "fresh-"), "eval", "eval", cfg.fresh_repeats, path)
            fcfg.pack, fcfg.tasks = str(fresh), None
            run_campaign(fcfg, out / name.replace("eval-", "fresh-"), console=console)
        stage("fresh instances", s)

    s = time.perf_counter()
    console.print("[bold]6. report[/]")
    from tbhpc.demo.results import write_results
    summary = write_results(out, cfg, console)
    stage("report", s)
    summary["stage_seconds"] = times
    summary["wall_s"] = round(time.perf_counter() - t0, 1)
    (out / "demo.json").write_text(json.dumps(summary, indent=1, default=str) + "\n", encoding="utf-8")
    console.print(f"demo finished in {summary['wall_s']} s; report: {out / 'report' / 'README.md'}")
    return 0


def fresh_pack(cfg: DemoConfig, out: Path) -> Path:
    """The demo pack's templates drawn with `fresh_seed`, `fresh_per_template` instances each (written
    once; the same bytes every time; the first N of a template are the same whatever the count)."""
    from tbhpc.domains.demo.pack import EVAL_PER_TEMPLATE, write_demo_pack
    n = cfg.fresh_per_template
    path = out / (f"fresh-pack-s{cfg.fresh_seed}" + ("" if n == EVAL_PER_TEMPLATE else f"-x{n}"))
    if not (path / "eval_ids.txt").exists():
        write_demo_pack(path, seed=cfg.fresh_seed, train=0, eval=n)
    return path


def run_training(tcfg: dict, run: Path, console: Console) -> str:
    """`tbhpc train` in a child process (its own DeepSpeed state); resumes a stopped run."""
    done = final_export(run, tcfg)
    if done:
        console.print(f"   trained checkpoint: {done} (done)")
        return str(done)
    run.parent.mkdir(parents=True, exist_ok=True)
    cfg_file = run.parent / "train.yaml"
    cfg_file.write_text(yaml.safe_dump(tcfg, sort_keys=False), encoding="utf-8")
    env = {**os.environ, "MASTER_PORT": str(_free_port()), "OMP_NUM_THREADS": str(tcfg.get("torch_threads", 1)),
           "DS_ACCELERATOR": "cpu"}
    _stream([sys.executable, "-m", "tbhpc.cli", "train", str(run), "--config", str(cfg_file)], console, env)
    done = final_export(run, tcfg)
    if done is None:
        raise UserError(f"demo: training finished without an export in {run / 'exports'}")
    if done.name != f"step-{tcfg['steps']:06d}":
        console.print(f"   training ended at {done.name} of {tcfg['steps']} steps; evaluating {done}")
    return str(done)


def final_export(run: Path, tcfg: dict) -> Path | None:
    """The export of a finished run: the trainer exports only at the end (the demo sets export_every
    to steps), whether the run reached its last step, spent `max_seconds` or was stopped by the
    collapse guard; so the last recorded step's export is there exactly when the run is over."""
    from tbhpc.store.run_dir import RunDir
    from tbhpc.train.record import read_steps
    if not (run / "logs" / "train_steps.jsonl").exists():
        return None
    last = max((int(r["step"]) for r in read_steps(RunDir(run))), default=0)
    export = run / "exports" / f"step-{last:06d}"
    return export if last and (export / "config.json").exists() else None


def _stream(cmd: list[str], console: Console, env: dict | None = None) -> None:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    tail: list[str] = []
    for line in proc.stdout:
        line = line.rstrip()
        tail = (tail + [line])[-20:]
        if _worth_showing(line):
            console.print(f"   {line}", highlight=False)
    if proc.wait() != 0:
        raise UserError(f"demo: `{' '.join(cmd[2:5])} ...` failed (exit {proc.returncode}):\n" + "\n".join(tail))


def _worth_showing(line: str) -> bool:
    noise = ("Loading weights", "Writing model shards", "[WARNING]", "[INFO]", "warnings.warn", "UserWarning",
             "FutureWarning", "return func(*args, **kwargs)")
    return bool(line.strip()) and not any(n in line for n in noise)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
