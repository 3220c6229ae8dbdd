"""What makes a TrainConfig wrong, in two passes: `check_fields` as the config is built (every
field's range and the combinations that cannot run: one line naming the field, before anything
else happens) and `check_run_inputs` before a run starts (the files it names exist, its
environment and the eval config of its exports load). The second is apart because a config is
also built where those files need not exist (`tbhpc plan`, `tbhpc doctor`, a run's resolved
config read back).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from tbhpc.errors import UserError
from tbhpc.slurm_options import check_env
from tbhpc.track.settings import check_trackers

if TYPE_CHECKING:   # the config calls these from its own methods
    from tbhpc.train.config import TrainConfig

# How the step's token losses are averaged (grpo.policy_loss). token-mean: the recipe's, over all
# loss tokens of the step. seq-mean-token-mean: the mean over episodes of each episode's token mean
# (verl's name). Why offer the second: under token-mean a group whose failures are longer than its
# successes pushes the total logprob of what was sampled down (sum of advantage x tokens < 0: so
# on 21 of the 24 steps of the demo run); seq-mean removes that push. It did not by itself keep the
# demo model from degrading at a too-large lr (docs/measurements/demo-history.md, "What GRPO did to the demo model").
LOSS_AGGS = ("token-mean", "seq-mean-token-mean")
ALGORITHMS = ("grpo", "rft")


def _finite(v: float) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def check_fields(cfg: TrainConfig) -> None:
    """Every field's range and the combinations that cannot run; one line naming the field."""
    for name in ("steps", "group_size", "groups_per_step", "episodes_in_flight", "max_tokens",
                 "response_budget", "microbatch_tokens", "torch_threads", "nodes", "checkpoint_every",
                 "logprob_chunk", "sp_size"):
        if getattr(cfg, name) < 1:
            raise UserError(f"train config: field {name!r} must be >= 1, got {getattr(cfg, name)!r}")
    if cfg.group_size < 2:
        raise UserError("train config: field 'group_size' must be >= 2 (a group of one has no baseline)")
    if not (_finite(cfg.refresh_below) and 0.0 <= cfg.refresh_below <= 1.0):
        raise UserError(f"train config: field 'refresh_below' must be within [0, 1] (0: off), got {cfg.refresh_below!r}")
    if cfg.refresh_window < 1 or cfg.refresh_size < 0:
        raise UserError("train config: fields 'refresh_window' (>= 1) and 'refresh_size' (>= 0) are out of range, "
                        f"got {cfg.refresh_window!r} and {cfg.refresh_size!r}")
    if cfg.refresh_pool and not cfg.refresh_below:
        raise UserError("train config: field 'refresh_pool' needs refresh_below > 0 (when to refresh the pool)")
    if cfg.draw_ahead < -1:
        raise UserError(f"train config: field 'draw_ahead' must be >= 0, or -1 (no bound), got {cfg.draw_ahead!r}")
    if cfg.max_staleness < 0:
        raise UserError(f"train config: field 'max_staleness' must be >= 0 (0: on-policy; k: tokens at most k updates "
                        f"old), got {cfg.max_staleness!r}")
    if cfg.tis_cap is not None and not (_finite(cfg.tis_cap) and (cfg.tis_cap == 0 or cfg.tis_cap >= 1)):
        raise UserError(f"train config: field 'tis_cap' must be 0 (off), a number >= 1, or unset (2 from "
                        f"max_staleness 2), got {cfg.tis_cap!r}")
    check_trackers(cfg.trackers, "train config")
    for name in ("tracker_samples_every", "tracker_samples"):
        if getattr(cfg, name) < 0:
            raise UserError(f"train config: field {name!r} must be >= 0, got {getattr(cfg, name)!r}")
    if cfg.generator not in ("server", "local", "batched"):
        raise UserError(f"train config: field 'generator' must be server, local or batched, got {cfg.generator!r}")
    if cfg.dtype not in ("auto", "fp32", "bf16"):
        raise UserError(f"train config: field 'dtype' must be auto, fp32 or bf16, got {cfg.dtype!r}")
    if cfg.zero_stage not in (0, 1, 2, 3):
        raise UserError(f"train config: field 'zero_stage' must be 0-3, got {cfg.zero_stage!r}")
    if isinstance(cfg.lora_rank, bool) or not isinstance(cfg.lora_rank, int) or cfg.lora_rank < 0:
        raise UserError(f"train config: field 'lora_rank' must be a whole number >= 0 (0: every parameter), got {cfg.lora_rank!r}")
    if cfg.lora_rank and not cfg.lora_alpha > 0:
        raise UserError(f"train config: field 'lora_alpha' must be > 0, got {cfg.lora_alpha!r}")
    if cfg.lora_sync not in ("adapter", "merged"):
        raise UserError(f"train config: field 'lora_sync' must be adapter or merged, got {cfg.lora_sync!r}")
    if not 0 <= cfg.lora_dropout < 1:
        raise UserError(f"train config: field 'lora_dropout' must be in [0, 1), got {cfg.lora_dropout!r}")
    if cfg.lora_rank and (not cfg.lora_targets or not all(isinstance(t, str) and t for t in cfg.lora_targets)):
        raise UserError(f"train config: field 'lora_targets' must name the linear layers to adapt, got {cfg.lora_targets!r}")
    if cfg.algorithm not in ALGORITHMS:
        raise UserError(f"train config: field 'algorithm' must be one of {', '.join(ALGORITHMS)}, got {cfg.algorithm!r}")
    if cfg.loss_agg not in LOSS_AGGS:
        raise UserError(f"train config: field 'loss_agg' must be one of {', '.join(LOSS_AGGS)}, got {cfg.loss_agg!r}")
    if not (0 <= cfg.clip_low < 1 and cfg.clip_high >= 0):
        raise UserError("train config: fields 'clip_low' (in [0,1)) and 'clip_high' (>= 0) are out of range")
    if cfg.dual_clip and cfg.dual_clip <= 1:
        raise UserError(f"train config: field 'dual_clip' must be > 1 or 0 (off), got {cfg.dual_clip!r}")
    _check_stability(cfg)
    _check_memory_fields(cfg)
    cfg.env = check_env(cfg.env, "train config: field 'env'")
    if len(cfg.betas) != 2 or not all(_finite(b) and 0 <= b < 1 for b in cfg.betas):
        raise UserError(f"train config: field 'betas' must be two numbers in [0, 1), got {cfg.betas!r}")
    for name, ok, want in (("lr", lambda v: v > 0, "> 0"), ("temperature", lambda v: v > 0, "> 0"),
                           ("top_p", lambda v: 0 < v <= 1, "in (0, 1]"), ("grad_clip", lambda v: v > 0, "> 0"),
                           ("weight_decay", lambda v: v >= 0, ">= 0"), ("sync_timeout_s", lambda v: v > 0, "> 0"),
                           ("sync_join_timeout_s", lambda v: v > 0, "> 0"), ("sync_bucket_mb", lambda v: v >= 1, ">= 1"),
                           ("max_seconds", lambda v: v >= 0, ">= 0 (0: no budget)"),
                           ("request_floor_tokens_per_s", lambda v: v > 0, "> 0"),
                           ("tracker_timeout_s", lambda v: v > 0, "> 0"),
                           ("collective_timeout_s", lambda v: v >= 0, ">= 0 (0: from request_timeout_s)")):
        v = getattr(cfg, name)
        if not (_finite(v) and ok(v)):
            raise UserError(f"train config: field {name!r} must be a finite number {want}, got {v!r}")
    if cfg.sync_transport not in ("files", "broadcast"):
        raise UserError(f"train config: field 'sync_transport' must be files or broadcast, got {cfg.sync_transport!r}")
    if cfg.sync_transport == "broadcast" and cfg.generator != "server":
        raise UserError("train config: field 'sync_transport' is broadcast, which needs generator=server (an "
                        f"in-process generator ({cfg.generator}) loads the published files)")
    if cfg.top_k < -1:
        raise UserError(f"train config: field 'top_k' must be >= 1, or 0 / -1 (off), got {cfg.top_k!r}")
    for name in ("max_draws", "max_reruns", "max_context", "export_every", "keep_checkpoints", "keep_published"):
        if getattr(cfg, name) < 0:
            raise UserError(f"train config: field {name!r} must be >= 0, got {getattr(cfg, name)!r}")
    if cfg.keep_published < cfg.max_staleness + 1:
        raise UserError(f"train config: field 'keep_published' must be >= {cfg.max_staleness + 1} with max_staleness "
                        f"{cfg.max_staleness} (a resumed step samples from weights that old)")
    if 0 < cfg.max_draws < cfg.groups_per_step:
        raise UserError(f"train config: field 'max_draws' ({cfg.max_draws}) must be >= groups_per_step "
                        f"({cfg.groups_per_step}), or 0 (4 x groups_per_step)")

def _check_stability(cfg: TrainConfig) -> None:
    for name in ("overlong_penalty", "min_group_std", "guard_length", "guard_entropy", "guard_lr_factor"):
        v = getattr(cfg, name)
        if not (_finite(v) and v >= 0):
            raise UserError(f"train config: field {name!r} must be a finite number >= 0, got {v!r}")
    if not 0 <= cfg.overlong_buffer <= cfg.response_budget:
        raise UserError(f"train config: field 'overlong_buffer' must be within [0, response_budget "
                        f"{cfg.response_budget}], got {cfg.overlong_buffer!r}")
    for name in ("guard_length", "guard_entropy"):
        if 0 < getattr(cfg, name) <= 1:
            raise UserError(f"train config: field {name!r} must be > 1 (a factor on the reference) or 0 (off), "
                            f"got {getattr(cfg, name)!r}")
    if cfg.guard_action not in ("rollback", "stop"):
        raise UserError(f"train config: field 'guard_action' must be rollback or stop, got {cfg.guard_action!r}")
    if not 0 < cfg.guard_lr_factor <= 1:
        raise UserError(f"train config: field 'guard_lr_factor' must be within (0, 1], got {cfg.guard_lr_factor!r}")
    ref = cfg.guard_reference
    if ref and not (len(ref) == 2 and all(_finite(v) and v > 0 for v in ref)):
        raise UserError(f"train config: field 'guard_reference' must be [tokens, entropy], two numbers > 0, got {ref!r}")
    if cfg.guard_window < 2 or cfg.guard_max_rollbacks < 0:
        raise UserError("train config: fields 'guard_window' (>= 2) and 'guard_max_rollbacks' (>= 0) are out of range")
    if cfg.guard_length or cfg.guard_entropy:
        if cfg.max_staleness:
            raise UserError("train config: the collapse guard (guard_length/guard_entropy) needs max_staleness 0")
        if cfg.checkpoint_every != 1 or cfg.keep_checkpoints < 2:
            raise UserError("train config: the collapse guard needs checkpoint_every 1 and keep_checkpoints >= 2 "
                            "(it restores the step before the one whose rollouts tripped it)")

def _check_memory_fields(cfg: TrainConfig) -> None:
    for name in ("gpu_memory_gb", "host_memory_gb"):
        v = getattr(cfg, name)
        if not (_finite(v) and v >= 0):
            raise UserError(f"train config: field {name!r} must be a finite number >= 0, got {v!r}")
    if cfg.offload_params and cfg.zero_stage != 3:
        raise UserError("train config: field 'offload_params' needs zero_stage 3 (only ZeRO-3 partitions parameters)")
    if cfg.offload_optimizer and cfg.zero_stage == 0:
        raise UserError("train config: field 'offload_optimizer' needs zero_stage 1, 2 or 3")
    if cfg.sp_size > 1 and cfg.zero_stage != 3:
        raise UserError("train config: field 'sp_size' > 1 needs zero_stage 3 (its ranks share one partitioned model)")


def check_run_inputs(cfg: TrainConfig, source: str = "train config") -> None:
    """What a run reads before it starts: the pool, model, servers and environment it names, and the
    eval campaign run on its exports."""
    if not cfg.model:
        raise UserError(f"{source}: field 'model' is required (an HF model directory)")
    if not cfg.pool:
        raise UserError(f"{source}: field 'pool' is required (the pool file `tbhpc select` wrote)")
    if not Path(cfg.pool).is_file():
        raise UserError(f"{source}: field 'pool': {cfg.pool} is not a file (the pool file `tbhpc select` wrote)")
    if cfg.refresh_pool and not Path(cfg.refresh_pool).is_file():
        raise UserError(f"{source}: field 'refresh_pool': {cfg.refresh_pool} is not a file (a pool file or task-id list)")
    if cfg.servers and not Path(cfg.servers).is_file():
        raise UserError(f"{source}: field 'servers': {cfg.servers} is not a file (the MCP servers file)")
    from tbhpc.openenv.launch import openenv_spec
    openenv_spec(cfg.environment, cfg.openenv, source)
    if cfg.model.startswith(("/", ".", "~")) and not Path(cfg.model).expanduser().is_dir():
        raise UserError(f"{source}: field 'model': {cfg.model} is not a directory (an HF model directory)")
    if cfg.export_eval or cfg.export_eval_overrides:
        _check_export_eval(cfg, source)

def _check_export_eval(cfg: TrainConfig, source: str) -> None:
    """The eval campaign run on every export gets its config and overrides only then, detached
    from the run: a typo found there would be one log line per export. Read it now, as
    `tbhpc eval` will (start_export_eval adds the policy fields)."""
    if not cfg.export_eval:
        raise UserError(f"{source}: field 'export_eval_overrides' needs 'export_eval' (the eval config they override)")
    from tbhpc.campaign.config import load_campaign    # the campaign package, only for runs that evaluate exports
    try:
        load_campaign(cfg.export_eval, "eval", cfg.export_eval_overrides)
    except UserError as exc:
        raise UserError(f"{source}: field 'export_eval' / 'export_eval_overrides': {exc}") from None
