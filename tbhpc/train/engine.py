"""The DeepSpeed layer: process group, engine, one GRPO update, consolidated weights, checkpoints.

Kept thin on purpose (the loss lives in grpo.py, the step in loop.py, the rank and device in dist.py,
the DeepSpeed config in dsconfig.py). What it must get right:
- every rank runs the same number of forward/backward passes (ZeRO-3 gathers parameters and
  reduce-scatters gradients inside them; a rank that skips one deadlocks the others), so ranks
  agree on the step's micro-batch count and pad theirs with zero-loss passes;
- the loss of every micro-batch is divided by the *global* loss-token count (episode count under
  seq-mean-token-mean) and multiplied by the
  world size the reducer averages over (grpo.policy_loss), so 1, 2 or 3 ranks give one update;
- one optimiser step per training step: DeepSpeed's accumulation boundary is set by hand on the
  last micro-batch (the count varies per step).
Backends: NCCL on GPUs, gloo on CPU (DS_ACCELERATOR=cpu). bf16 on GPU, fp32 on CPU.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, replace
from typing import NoReturn

from tbhpc import progress
from tbhpc.errors import TbhpcError, UserError
from tbhpc.train import memstat
from tbhpc.train.config import TrainConfig
from tbhpc.train.dist import DistEnv, bind_gpu, use_gpu
from tbhpc.train.dsconfig import attention_kernel, ds_config, resolved_dtype
from tbhpc.train.grpo import policy_loss
from tbhpc.train.lora import adapted_layers, base_name
from tbhpc.train.rft import nll_loss
from tbhpc.train.packing import Packed

# torch and the modules built on it (logprobs, loading, longseq) are imported where they are used:
# `tbhpc train` sets the OpenMP policy before torch loads, and a bad command line fails without it


@dataclass
class UpdateStats:
    loss: float = 0.0
    grad_norm: float = 0.0
    loss_tokens: int = 0          # this rank
    tokens: int = 0               # this rank, packed (no padding exists)
    micro_batches: int = 0        # this rank, real ones
    clip_fraction: float = 0.0
    mismatch: float = 0.0         # mean |trainer - server| logprob on this rank's loss tokens
    ratio_max: float = 0.0
    truncated: float = 0.0        # share of this rank's loss tokens whose IS weight hit tis_cap
    by_staleness: list | None = None   # this rank's [loss tokens, clipped, truncated, sum |log pi/mu|] per staleness
    entropy: float = 0.0          # mean entropy of the trained policy over this rank's loss tokens (nats)
    peak_bytes: int = 0           # this rank's peak memory during the update (GPU allocated, or CPU resident)


class Engine:
    def __init__(self, cfg: TrainConfig, env: DistEnv):
        import torch

        self.cfg, self.env = cfg, env
        self.gpu = use_gpu()
        if not self.gpu:
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
            torch.set_num_threads(cfg.torch_threads)
        import deepspeed
        from transformers import AutoTokenizer

        if self.gpu:     # before NCCL's communicator is built; LOCAL_RANK then names the same GPU
            torch.cuda.set_device(bind_gpu(env, torch.cuda.device_count()))
        else:
            env.export()
            # DeepSpeed's CPU backend JIT-compiles its shared-memory all-reduce op when it starts (~25 s
            # with g++ on every new environment: the first step of each `make demo` from a fresh clone).
            # That op serves only inference_all_reduce (tensor-parallel inference); training reduces
            # through the gloo process group. Marked incompatible, it is never built.
            deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
        from datetime import timedelta
        deepspeed.init_distributed(dist_backend="nccl" if self.gpu else "gloo", verbose=False,
                                   timeout=timedelta(seconds=cfg.collective_timeout))
        self.sp = cfg.sp_size
        if env.world % self.sp:
            raise UserError(f"train config: field 'sp_size' ({self.sp}) must divide the trainer's {env.world} ranks")
        self.tokenizer = AutoTokenizer.from_pretrained(cfg.model)
        model, config, mpu = self._build_model()
        trained = [p for p in model.parameters() if p.requires_grad]     # LoRA: the adapters only
        self.engine, *_ = deepspeed.initialize(model=model, model_parameters=trained, config=config, mpu=mpu)
        self.device = self.engine.device
        from tbhpc.train.precision import check_dtype
        check_dtype(self.engine.module, resolved_dtype(cfg, self.gpu), cfg.zero_stage)

    def _build_model(self):
        """The policy, ready for deepspeed.initialize: loaded (partitioned under ZeRO-3), its output head
        computing chunked logprobs, the memory options applied. Returns (model, DeepSpeed config, mpu)."""
        import torch
        from transformers import AutoConfig

        from tbhpc.train import longseq
        from tbhpc.train.loading import load_hf, load_partitioned
        from tbhpc.train.logprobs import install as install_logprob_head
        cfg = self.cfg
        dtype = torch.bfloat16 if resolved_dtype(cfg, self.gpu) == "bf16" else torch.float32
        hidden = AutoConfig.from_pretrained(cfg.model).get_text_config().hidden_size
        config, attn = ds_config(cfg, self.gpu, hidden), attention_kernel(self.gpu)
        if cfg.zero_stage == 3:
            model = load_partitioned(cfg.model, dtype, attn, config, self.env.rank)
        else:
            model = load_hf(cfg.model, dtype, attn)
        install_logprob_head(model)
        mpu = None
        if self.sp > 1:
            mpu = longseq.register_ulysses(model, attn, self.sp)
            self.sp_group, self.sp_rank = mpu.get_sequence_parallel_group(), mpu.get_sequence_parallel_rank()
        if cfg.tiled_mlp:    # called inside forwards, after the engine (and self.device) exists
            longseq.tile_mlps(model, lambda n: int(self.all_reduce([n], "max")[0]))
        if cfg.checkpoint_offload:
            longseq.offload_checkpoints(model)
        elif cfg.gradient_checkpointing:     # non-reentrant under LoRA: a frozen base gives no input a grad
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": not cfg.lora_rank})
        model.config.use_cache = False
        if cfg.lora_rank:
            from tbhpc.train import lora
            model = lora.wrap(model, cfg.lora_rank, cfg.lora_alpha, cfg.lora_dropout, cfg.lora_targets, cfg.seed)
        return model, config, mpu

    @property
    def module(self):
        return self.engine.module

    def all_reduce(self, values: list[float], op: str = "sum") -> list[float]:
        import torch
        import torch.distributed as dist
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        if self.env.world > 1:
            dist.all_reduce(t, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX)
        return t.tolist()

    def barrier(self) -> None:
        import torch.distributed as dist
        if self.env.world > 1:
            dist.barrier()

    def close(self) -> None:
        """All ranks agree they are done, then the process group is torn down in order (left to
        interpreter exit, gloo's threads can abort a finished rank: 'terminate called without an
        active exception')."""
        import torch.distributed as dist
        if dist.is_initialized():
            self.barrier()
            dist.destroy_process_group()

    def leave(self, code: int) -> NoReturn:
        """A rank's last act, once its work is written: close the group, flush, and end the process
        without the interpreter's teardown. Python's exit runs the C++ destructors of gloo/DeepSpeed
        threads that may still be joinable, and one of them can abort a rank whose work is done
        ('terminate called without an active exception', exit -6: seen on a 3-rank CPU run under
        load). A status of -6 after a finished step would read as a crash to Slurm and to tests."""
        self.close()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(code)

    def update(self, packs: list[Packed]) -> UpdateStats:
        """One optimiser step on this rank's packed micro-batches (collective: every rank calls it)."""
        import torch

        from tbhpc.train import longseq
        from tbhpc.train.logprobs import token_logprobs

        cfg = self.cfg
        memstat.reset_peak(self.gpu)
        if self.sp > 1:     # the SP group trains on its pooled micro-batches, each rank on its slice of each
            packs = [longseq.sp_slice(p, self.sp_rank, self.sp, count_episodes=self.sp_rank == 0)
                     for p in longseq.sp_share(packs, self.sp_group, self.sp)]
        # ZeRO-3's reduce-scatter averages every gradient over all ranks, sequence-parallel peers included
        # (its contiguous-bucket path would divide by world / sp instead: ds_config pins reduce_scatter on)
        reducer = self.env.world
        local_tokens = sum(p.n_loss_tokens for p in packs)
        local_episodes = sum(len(p.episodes) for p in packs)
        global_tokens, global_episodes = self.all_reduce([local_tokens, local_episodes], "sum")
        n_micro = int(self.all_reduce([len(packs)], "max")[0])
        normaliser = global_episodes if cfg.loss_agg == "seq-mean-token-mean" else global_tokens
        st = UpdateStats(loss_tokens=local_tokens, tokens=sum(p.n_tokens for p in packs), micro_batches=len(packs))
        if global_tokens <= 0:
            return st
        self.engine.train()
        clipped = mism = capped = ent = 0.0
        plain = None
        for k in range(n_micro):
            self.engine.set_gradient_accumulation_boundary(k == n_micro - 1)
            if k < len(packs):
                p = packs[k]
                lp, entropy = token_logprobs(self.engine, _to(p, self.device), cfg.logprob_chunk, entropy=True)
                ent += float((entropy.detach() * p.loss_mask.to(entropy)).sum())
                weights = None if p.weights is None else p.weights.to(self.device)
                if cfg.algorithm == "rft":      # supervised on the passed episodes (train/rft.py)
                    loss, s = nll_loss(lp, p.behaviour.to(self.device), p.loss_mask.to(self.device), normaliser,
                                       reducer, weights)
                else:
                    loss, s = policy_loss(lp, p.behaviour.to(self.device), p.advantages.to(self.device),
                                          p.loss_mask.to(self.device), normaliser, cfg.clip_low, cfg.clip_high,
                                          reducer, cfg.dual_clip, weights, cfg.truncation_cap, p.staleness,
                                          cfg.max_staleness + 1)
                    if s.by_staleness:
                        st.by_staleness = [[a + b for a, b in zip(x, y)] for x, y in
                                           zip(st.by_staleness or [[0.0] * 4] * len(s.by_staleness), s.by_staleness)]
                clipped += s.clip_fraction * s.loss_tokens
                capped += s.truncated * s.loss_tokens
                mism += s.mismatch * s.loss_tokens
                st.ratio_max = max(st.ratio_max, s.ratio_max)
                st.loss += float(loss.item()) / reducer
            else:   # this rank has fewer micro-batches: a zero-loss pass keeps the collectives in step
                ids = torch.zeros((1, 2), dtype=torch.long, device=self.device)
                pos = torch.arange(2, device=self.device)[None]
                loss = self.engine(input_ids=ids, position_ids=pos, use_cache=False).logits.sum() * 0.0
            self.engine.backward(loss)
            progress.mark()
            if k == n_micro - 1 and cfg.zero_stage == 0:
                # DeepSpeed clips but does not keep the norm without ZeRO: measure the reduced gradient here
                plain = torch.sqrt(sum((q.grad.float() ** 2).sum() for q in self.module.parameters() if q.grad is not None))
            self.engine.step()
        norm = plain if cfg.zero_stage == 0 else self.engine.get_global_grad_norm()
        st.grad_norm = float(norm) if norm is not None else 0.0
        st.clip_fraction = clipped / local_tokens if local_tokens else 0.0
        st.mismatch = mism / local_tokens if local_tokens else 0.0
        st.truncated = capped / local_tokens if local_tokens else 0.0
        st.entropy = ent / local_tokens if local_tokens else 0.0
        st.peak_bytes = memstat.peak(self.gpu)
        return st

    def consolidated_state_dict(self) -> dict | None:
        """Full weights on rank 0 (None elsewhere); collective under ZeRO-3."""
        if self.cfg.zero_stage == 3:
            sd = self.engine._zero3_consolidated_16bit_state_dict()
            return sd if self.env.rank == 0 else None
        return {k: v.detach().cpu() for k, v in self.module.state_dict().items()} if self.env.rank == 0 else None

    def param_meta(self) -> list[dict]:
        """Name, full shape and dtype of every parameter (tied ones once), in `full_params` order."""
        out = []
        for name, p in self._named_params():
            shape = list(getattr(p, "ds_shape", None) or p.shape)
            out.append({"name": name, "shape": [int(d) for d in shape], "dtype": str(p.dtype).removeprefix("torch.")})
        return out

    def _named_params(self):
        """The published parameters under the base model's names: under LoRA the adapters are merged
        into the weights they adapt (full_params), so they are not listed themselves."""
        seen: set[int] = set()
        lora = self.cfg.lora_rank > 0
        for name, p in self.module.named_parameters():
            if id(p) in seen or (lora and (".lora_A." in name or ".lora_B." in name)):
                continue
            seen.add(id(p))
            yield (base_name(name) if lora else name), p

    def full_params(self, keep=None):
        """(index, name, full tensor) of every parameter, in `param_meta` order, to the ranks where
        `keep(index)` holds (None elsewhere). Under ZeRO-3 parameters are gathered a module at a time
        (collective: every rank iterates to the end), so no rank ever holds the whole model; a kept
        tensor is a copy (the gathered buffer is released when its module's turn ends). Default: rank 0."""
        if keep is None:
            rank0 = self.env.rank == 0
            keep = lambda i: rank0     # noqa: E731
        index = {id(p): i for i, (_, p) in enumerate(self._named_params())}
        names = {id(p): n for n, p in self._named_params()}
        adapted = adapted_layers(self.module) if self.cfg.lora_rank else {}
        done: set[int] = set()
        for module in self.module.modules():
            params = [p for p in module.parameters(recurse=False) if id(p) in index and id(p) not in done]
            if not params:
                continue
            done.update(id(p) for p in params)
            for p in [p for p in params if id(p) in adapted]:     # a LoRA layer's base weight: merged
                yield from self._merged(adapted[id(p)], index[id(p)], names[id(p)], keep)
            params = [p for p in params if id(p) not in adapted]
            if not params:
                continue
            if self.cfg.zero_stage == 3:
                import deepspeed
                with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
                    for p in params:
                        i = index[id(p)]
                        yield i, names[id(p)], (p.data.detach().clone() if keep(i) else None)
            else:
                for p in params:
                    i = index[id(p)]
                    yield i, names[id(p)], (p.data.detach() if keep(i) else None)

    def _merged(self, layer, i: int, name: str, keep):
        from tbhpc.train.lora import layer_params, merged
        if self.cfg.zero_stage == 3:
            import deepspeed
            with deepspeed.zero.GatheredParameters(layer_params(layer), modifier_rank=None):
                yield i, name, (merged(layer, layer.base_layer.weight.data).clone() if keep(i) else None)
        else:
            yield i, name, (merged(layer, layer.base_layer.weight.data) if keep(i) else None)

    def save(self, ckpt_dir: str, tag: str, client_state: dict) -> None:
        self.engine.save_checkpoint(ckpt_dir, tag=tag, client_state=client_state)

    def load(self, ckpt_dir: str, tag: str | None = None) -> dict | None:
        """Resume from the newest DeepSpeed checkpoint in `ckpt_dir` (None when there is none), or
        from the one named `tag` (the collapse guard's rollback)."""
        if tag is None and not os.path.exists(os.path.join(ckpt_dir, "latest")):
            return None
        _, client = self.engine.load_checkpoint(ckpt_dir, tag=tag, load_optimizer_states=True,
                                                load_lr_scheduler_states=True)
        if client is None:
            raise TbhpcError(f"{ckpt_dir}: no DeepSpeed checkpoint {tag or 'latest'} could be loaded")
        return client

    def set_lr(self, lr: float) -> None:
        """The optimiser's learning rate from now on (a loaded checkpoint brings back its own)."""
        for group in self.engine.optimizer.param_groups:
            group["lr"] = lr


def _to(p: Packed, device) -> Packed:
    if str(device) == "cpu":
        return p
    return replace(p, input_ids=p.input_ids.to(device), position_ids=p.position_ids.to(device))
