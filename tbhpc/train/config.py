"""What a GRPO training run is: model, pool, batch shape, loss, optimiser, engine and where the
rollouts come from. One dataclass, loaded from YAML (jobs/train*.yaml) with key=value overrides.

Defaults are the published recipe (18 groups of 8, one update per step, token-mean PPO-clip
0.2/0.2 with dual clip 3, no KL, AdamW lr 1e-6, grad-clip 1.0, ZeRO-3), with advantages only
group-centred (`normalize_std` off) and no weight decay (`weight_decay` 0); both are fields a run
may turn on. The `slurm` and `serve` sections say how `tbhpc submit train` launches it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tbhpc.config import load_config
from tbhpc.plan.memory import require_fit
from tbhpc.policy.sampling import Sampling
from tbhpc.slurm_options import SlurmOptions
from tbhpc.train.checks import check_fields, check_run_inputs


@dataclass
class TrainConfig:
    name: str = "train"                   # the run's name: the campaign column of its attempt rows
    model: str = ""                       # HF directory of the initial policy (tokenizer + chat template inside)
    pool: str = ""                        # the `select` output (pool.yaml), or any task-id list
    exclude: list[str] = field(default_factory=list)   # id lists that must not appear in the pool (e.g. the eval split)
    pack: str | None = None               # task pack, or tb:DIR (a ThinkingBox data checkout); None = the bundled pack
    servers: str | None = None            # servers file for MCP tool servers (tb: packs)
    environment: str = "local"            # local (tbhpc's backends) | openenv (rollouts on the OpenEnv environment below)
    openenv: dict[str, Any] = field(default_factory=dict)   # OpenEnvSpec: url | launch | uv_project, timeouts
    steps: int = 50  # optimiser updates (the run ends after the last, or at max_seconds)
    max_seconds: float = 0.0              # a wall-time budget: the run ends after the step that reaches it (0: off)
    seed: int = 0  # seeds the draws, the sampling and the engine: the same seed redraws the same groups
    # the batch: B informative groups of G episodes per step
    group_size: int = 8  # G: episodes per group (one task), whose rewards centre each other's advantage
    groups_per_step: int = 18             # B: informative groups per update
    max_draws: int = 0                    # cap on groups drawn per step (replacement of zero-variance ones); 0 = 4 x B
    max_reruns: int = 3                   # system-error re-runs per episode before its group is dropped
    draw_ahead: int = -1                  # groups in flight beyond the B a step could still keep (-1: no bound)
    # the curriculum (train/curriculum.py): when the mixed-group share over the last refresh_window steps falls
    # below refresh_below, tasks whose last groups (two or more) put them outside the pool's bands leave,
    # and as many candidates of refresh_pool join (refresh_size: that many instead). 0: the pool never changes
    refresh_below: float = 0.0
    refresh_window: int = 10              # steps over which the mixed-group share is measured
    refresh_pool: str = ""                # candidate task ids (a pool file or id list); empty: re-band only
    refresh_size: int = 0                 # candidates that join at a refresh (0: as many as left)
    # 0: on-policy, rollouts wait for the previous update. k >= 1: the rollouts of steps s+1 .. s+k run while
    # step s updates, step t claiming draws once weights at most k versions behind it are served (train/window.py)
    max_staleness: int = 0
    # where tokens come from: the run's vLLM server (endpoint.json) or the policy in this process
    generator: str = "server"             # server | local | batched (in process; batched serves episodes_in_flight together)
    episodes_in_flight: int = 32          # concurrent episodes of the whole run (server mode): each rank runs
                                          # ceil(this / ranks) of them (in_flight_per_rank)
    request_floor_tokens_per_s: float = 5.0   # the slowest decode a generation request may run at: its HTTP
                                              # timeout is max_tokens / this + 60 s (request_timeout_s)
    # how the rollouts sample (the `sampling` property): flat, as configs and overrides have always spelt them
    temperature: float = 1.0
    top_k: int = 20                           # sampling: top-k (0 or -1: off)
    top_p: float = 0.95                       # sampling: nucleus mass
    max_tokens: int = 1024                # per generation
    response_budget: int = 8192           # generated tokens per episode
    max_context: int = 0                  # stop an episode whose prompt reaches this (0: no check)
    user: str = "scripted"                # scripted | openai (then user_url, user_model)
    user_url: str | None = None           # the simulated user's OpenAI-compatible endpoint (user: openai)
    user_model: str = "default"           # the simulated user's model name
    judge: str = "keyword"                # keyword | openai (then judge_url, judge_model)
    judge_url: str | None = None          # the judge's OpenAI-compatible endpoint (judge: openai)
    judge_model: str = "default"          # the judge's model name
    # the loss
    algorithm: str = "grpo"               # grpo | rft: fine-tune on the episodes whose check passed (train/rft.py)
    normalize_std: bool = False  # divide advantages by the group's reward std (off: the recipe's group-centred advantage)
    loss_agg: str = "token-mean"          # token-mean (the recipe) | seq-mean-token-mean (every episode weighs the same)
    clip_low: float = 0.2                 # PPO clip below: ratio >= 1 - clip_low
    clip_high: float = 0.2                # PPO clip above: ratio <= 1 + clip_high
    dual_clip: float = 3.0                # cap on the loss of negative-advantage tokens (0: off)
    tis_cap: float | None = None          # truncated IS (decoupled loss, grpo.py): weight min(pi/mu, cap); 0: off;
                                          # unset: 2 with max_staleness >= 2, else off (truncation_cap)
    # stability (train/stability.py), all off by default
    overlong_filter: bool = False         # episodes cut off by response_budget: in the group baseline, never trained on
    overlong_buffer: int = 0              # soft overlong penalty over the budget's last N generated tokens (0: off)
    overlong_penalty: float = 1.0         # the penalty at the budget (subtracted from the reward the advantage sees)
    min_group_std: float = 0.0            # groups whose reward std is below this are replaced like flat ones
    guard_length: float = 0.0             # collapse guard: mean generated tokens > this x the reference (0: off)
    guard_entropy: float = 0.0            # collapse guard: entropy > this x the reference (0: off; a fall is sharpening)
    guard_window: int = 5                 # the reference: median of the first N steps (never judged themselves)
    guard_reference: list[float] = field(default_factory=list)   # or a given [tokens, entropy] (e.g. an earlier run's)
    guard_action: str = "rollback"        # rollback (the last good step's state, lr x guard_lr_factor) | stop
    guard_lr_factor: float = 0.5          # lr multiplier after each rollback
    guard_max_rollbacks: int = 3          # then the next trip stops the run
    # the optimiser and engine
    lr: float = 1e-6
    weight_decay: float = 0.0             # AdamW weight decay
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])  # AdamW betas
    grad_clip: float = 1.0                # gradient-norm clip
    zero_stage: int = 3  # DeepSpeed ZeRO stage (3 partitions parameters, gradients and optimiser state)
    dtype: str = "auto"                   # auto (bf16 on GPU, fp32 on CPU) | fp32 | bf16
    gradient_checkpointing: bool = False  # recompute each layer's activations in the backward (memory for time)
    # LoRA (peft): rank 0 trains every parameter; > 0 freezes the base and trains low-rank adapters on the
    # `lora_targets` linear layers (only they are in the optimiser; docs/lora.md)
    lora_rank: int = 0
    lora_alpha: float = 16.0              # LoRA scale alpha (the update is alpha / r x B A)
    lora_dropout: float = 0.0             # dropout on the LoRA input
    lora_targets: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj",   # the linear
                                                             "gate_proj", "up_proj", "down_proj"])   # layers adapted
    # what a LoRA step publishes: adapter (the adapter alone, in PEFT's format; the server loads it in
    # place over the base it serves) | merged (W + (alpha / r) B A under the base names, like a full run)
    lora_sync: str = "adapter"
    export_merged: bool = False           # LoRA exports: also RUN/exports/step-N-merged, an HF checkpoint without peft
    microbatch_tokens: int = 16384        # packed tokens per forward pass
    torch_threads: int = 1                # CPU ranks
    # memory (tbhpc plan prints what each costs; none changes what is learnt)
    logprob_chunk: int = 2048             # positions per chunk of the output head (logprobs never hold [T, V])
    sp_size: int = 1                      # Ulysses sequence parallelism: ranks that share one micro-batch's tokens
    tiled_mlp: bool = False               # the MLP runs on slices of at most hidden_size tokens (DeepSpeed TiledMLP)
    checkpoint_offload: bool = False      # gradient checkpoints (each layer's input) kept in host memory
    offload_optimizer: bool = False       # ZeRO: fp32 master weights, gradients and Adam states in host memory
    offload_params: bool = False          # ZeRO-3: bf16 parameter partitions in host memory too
    gpu_memory_gb: float = 80.0           # memory of one GPU, for the plan (H100 80, H200 141)
    host_memory_gb: float = 0.0           # memory of one node, for the plan (0: not checked)
    # what the run keeps
    checkpoint_every: int = 1             # DeepSpeed checkpoint (optimizer state) every N steps, for resume
    keep_checkpoints: int = 2             # DeepSpeed checkpoints kept
    keep_published: int = 2               # published weight directories kept (the server loads only the newest)
    export_every: int = 0                 # HF export to RUN/exports/step-N every N steps (0: only the last step)
    export_eval: str = ""                 # an eval campaign config run on every export (RUN/evals/step-N), off if empty
    export_eval_overrides: list[str] = field(default_factory=list)   # key=value for it, e.g. [limit=50, repeats=4]
    sync_timeout_s: float = 900.0         # wait this long for the server to announce new weights
    # how a step's weights reach the server (generator=server): files every rank writes in parallel, or a
    # broadcast into the running server's workers (gloo on CPUs, NCCL on GPUs) that falls back to files
    # when the server does not join within sync_join_timeout_s (serve/broadcast.py)
    sync_transport: str = "files"
    sync_join_timeout_s: float = 300.0    # broadcast: how long the server may take to join before files are used
    sync_bucket_mb: int = 256             # tensors per broadcast call, in MB of their bytes
    # how long a rank waits for its peers (train/watch.py): for one that finishes no work (a generation
    # request, an episode, a micro-batch) while the others wait after their rollouts, and in a collective
    # (the process group's timeout); a peer whose heartbeat stops ends the run within min(this, 120 s).
    # 0: twice request_timeout_s, at least 1,800 s
    collective_timeout_s: float = 0.0
    tensorboard: bool = False             # scalars to RUN/tensorboard as well (the same as tensorboard in trackers)
    # where the step rows also go, from rank 0 (results.duckdb stays the record): any of tensorboard, trackio,
    # wandb, mlflow; offline in RUN/trackers wherever they must be (docs/guides/trackers.md)
    trackers: list[str] = field(default_factory=list)
    tracker_project: str = "tbhpc"        # the wandb / trackio project, the MLflow experiment
    tracker_tags: list[str] = field(default_factory=list)   # tags on the tracker run
    tracker_samples_every: int = 10       # every N steps a table of a few of the step's episodes (0: none)
    tracker_samples: int = 4              # episodes in that table (task, reward, the transcript `tbhpc show` prints)
    tracker_timeout_s: float = 60.0       # the end of the run waits this long for the trackers to finish writing
    # how `tbhpc submit train` launches it
    nodes: int = 1
    gpus_per_node: int = 0                # 0: CPU nodes, one rank per node
    serve_config: str = "jobs/serve.yaml"  # the serving job's config (its fields overridden by `serve`)
    serve: dict[str, Any] = field(default_factory=dict)    # ServeConfig overrides for the serving job
    # exported in the trainer's and the serving job's scripts: NCCL / InfiniBand settings (NCCL_IB_HCA,
    # NCCL_SOCKET_IFNAME, NCCL_DEBUG, ...) that differ from cluster to cluster
    env: dict[str, str] = field(default_factory=dict)
    # the trainer job's Slurm options (nodes and GPUs from the fields above)
    slurm: SlurmOptions = field(default_factory=lambda: SlurmOptions(time="24:00:00", mem="16G", cpus_per_task=2))

    def __post_init__(self) -> None:
        check_fields(self)          # every field's range, as the config is built (train/checks.py)

    def tracker_names(self) -> list[str]:
        """The trackers this run logs to (`tensorboard: true` is one of them)."""
        return self.trackers + (["tensorboard"] if self.tensorboard and "tensorboard" not in self.trackers else [])

    def in_flight_per_rank(self, ranks: int) -> int:
        """Episodes one of `ranks` trainer ranks keeps in flight: its share of the run's total (fewer
        than a group's: the group's episodes queue for the rank's slots)."""
        return max(1, math.ceil(self.episodes_in_flight / max(ranks, 1)))

    @property
    def sampling(self) -> Sampling:
        """The rollouts' sampling, from its flat fields (the one place they become a Sampling)."""
        return Sampling(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, max_tokens=self.max_tokens)

    @property
    def request_timeout_s(self) -> float:
        """How long one generation request may take: max_tokens at the floor rate, plus a minute of
        queueing and prefill (a request that would decode slower counts as a failed request, re-run)."""
        return self.max_tokens / self.request_floor_tokens_per_s + 60.0

    @property
    def collective_timeout(self) -> float:
        """Seconds a rank waits for a peer that finishes no work (collective_timeout_s, or its default:
        two generation requests' worth, at least 30 minutes)."""
        return self.collective_timeout_s or max(1800.0, 2 * self.request_timeout_s)

    @property
    def silence_timeout(self) -> float:
        """Seconds without a heartbeat after which a peer counts as gone (frozen, killed, node lost)."""
        return min(120.0, self.collective_timeout)

    @property
    def truncation_cap(self) -> float:
        """The importance-weight cap the loss uses: tis_cap, or when unset 2 from max_staleness 2 on
        (a token may then be two or more updates old; 2 is verl's and SkyRL's TIS default) and off
        below (one update behind, the PPO clip bounds the step as before)."""
        if self.tis_cap is not None:
            return float(self.tis_cap)
        return 2.0 if self.max_staleness >= 2 else 0.0

    @property
    def draw_cap(self) -> int:
        return self.max_draws or 4 * self.groups_per_step

    @property
    def adapter_sync(self) -> bool:
        """A LoRA run that publishes its adapter alone (and so wants a server with LoRA on)."""
        return self.lora_rank > 0 and self.lora_sync == "adapter"

    def validate(self, source: str = "train config") -> None:
        """What a run needs beyond sound fields: its pool, model and servers on disk, a valid
        environment, and the eval config of its exports (train/checks.py)."""
        check_run_inputs(self, source)


def load_train_config(path: Path | str | None, overrides: list[str] | tuple = (),
                      updates: dict[str, Any] | None = None) -> TrainConfig:
    """The one way a run's training config is read (`tbhpc train`, `tbhpc submit train`, the API):
    the YAML file < `updates` < `key=value` overrides, then every check a run needs before it
    writes anything: the fields (`validate`) and the memory plan (a config that cannot fit the
    GPUs it names is refused here, not after the model loads)."""
    source = str(path or "train config")
    cfg = load_config(TrainConfig, path, list(overrides), updates=updates)
    cfg.validate(source)
    require_fit(cfg, source)
    return cfg
