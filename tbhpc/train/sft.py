"""Warm start by supervised fine-tuning on oracle episodes: the model learns the chat template,
the tool-call format and the domains' procedures, so that GRPO starts from a policy that solves
tasks *sometimes* (a policy that never succeeds gives only zero-variance groups: no signal).

The examples are built exactly as rollouts are: the oracle plays the episode (real backend, real
simulated user, graded), and a `TokenTrace` records the prompt tokens (loss mask 0) and the
oracle's text tokenised as if the model had generated it (loss mask 1, end-of-turn included).
So the warm start is trained on the token stream the trainer and the server will see.
Plain torch in one process: a warm start of a small model needs no DeepSpeed.
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path

from tbhpc.errors import UserError
from tbhpc.tasks.loader import default_pack_dir
from tbhpc.env.agent import Completion
from tbhpc.rollout.buffer import Episode
from tbhpc.rollout.tokens import TokenTrace


@dataclass
class Phase:
    """One stretch of fine-tuning with its own AdamW state and learning-rate schedule."""
    steps: int
    lr: float
    window: int = 0      # > 0: train on the first `window` tokens after the system turn (the copying curriculum)
    warmup: int = 0      # linear warm-up steps
    decay: int = 0       # > 0: linear decay to 5% over this many steps (more than `steps`: a phase cut short)
    gate: str = "first"  # with a held-out gate (warm_select.py): "first" ends the phase at the first checkpoint in
                         # the band; "best" runs it to the end or a plateau and keeps its best checkpoint in the band;
                         # "plateau" keeps the best checkpoint by pass@1 alone and ends where pass@1 stops rising

    def factor(self, step: int) -> float:
        up = min(1.0, (step + 1) / self.warmup) if self.warmup else 1.0
        return up * (max(0.05, 1 - step / self.decay) if self.decay else 1.0)


DEMO_PACK = default_pack_dir().parent / "demo"

# Named warm-start recipes (`tbhpc warmstart --recipe NAME`): one place for the flags that
# `make warmstart-demo` and the demo pipeline use. "demo" is the chain that made the committed
# models/demo-warm: windows first (copying), then whole episodes in two stretches.
RECIPES = {
    "demo": dict(size="demo", split="train", ask=True, augment=8, batch_tokens=8000, threads=2,
                 phases=[Phase(600, 2e-3, window=320, warmup=30), Phase(750, 1e-3, warmup=30, decay=1000),
                         Phase(1000, 5e-4, warmup=30, decay=1000)]),
    # The demo-pack model (`make warmstart-demo`): whole ~270-token episodes from the start (values
    # are copied from a short query, no curriculum needed), one decaying stretch, stopped by the
    # held-out gate (warm_select.py) once it is right about half the time or more.
    "demo-pack": dict(size="demo-pack", split="train", pack=str(DEMO_PACK), ask=False, augment=0, batch_tokens=8000,
                      threads=2, select=True, select_every=50, phases=[Phase(3000, 2e-3, warmup=50, decay=3000)]),
    # The demo's GRPO start (`make warmstart-plateau`, models/demo-pack-plateau): the same SFT continued from
    # the gate's checkpoint on the same episodes at a quarter of its rate, decaying, until held-out pass@1 stops
    # rising (3 evaluations of 110 fresh instances x 8 without beating the best by more than 0.5 pt). The best
    # checkpoint is kept and the whole curve goes to selection.json.
    "demo-pack-plateau": dict(size="demo-pack", base=Path("models/demo-pack-warm"), split="train", pack=str(DEMO_PACK),
                              ask=False, augment=0, batch_tokens=8000, threads=2, select=True, select_every=100,
                              select_repeats=8, patience=3, min_delta=0.005,
                              phases=[Phase(2000, 5e-4, warmup=20, decay=2000, gate="plateau")]),
    # SmolLM2-135M-Instruct (`make demo MODEL=smollm2`): it has never seen the tool-call format, and
    # a step of 4k tokens costs ~45 s on 2 cores (~90 tokens/s forward + backward), so: a few dozen
    # steps of whole episodes at a full fine-tune's usual rate, enough to learn the format.
    "smollm2": dict(size="smollm2", split="train", ask=True, augment=0, batch_tokens=4096, threads=2,
                    phases=[Phase(40, 1e-4, warmup=4, decay=40)]),
    "smollm2-demo-pack": dict(size="smollm2", split="train", pack=str(DEMO_PACK), ask=False, augment=0, batch_tokens=4096,
                              threads=2, phases=[Phase(40, 1e-4, warmup=4, decay=40)]),
}


@dataclass
class _Recorder:
    """An oracle session whose every completion is also appended to a token trace."""
    inner: object
    trace: TokenTrace

    def complete(self, messages: list[dict], tools: list[dict]) -> Completion:
        c = self.inner.complete(messages, tools)
        self.trace.prompt(messages, tools)
        tok = self.trace.tokenizer
        ids = tok.encode(c.text, add_special_tokens=False) + [tok.eos_token_id]
        self.trace.add_generation(ids, [0.0] * len(ids), "base")
        return c


@dataclass
class _RecordingPolicy:
    tokenizer: object
    inner: object
    name: str = "oracle-recorded"
    last: TokenTrace | None = None

    def session(self, task, seed: int = 0):
        self.last = TokenTrace(self.tokenizer)
        return _Recorder(self.inner.session(task, seed), self.last)


def oracle_examples(tokenizer, tasks: list, seed: int = 0, ask: bool = False) -> list[Episode]:
    """One token-exact example per task: the oracle's episode (only passed episodes are kept).
    `ask`: the oracle first asks the user for the facts its calls use, as a model must."""
    from tbhpc.domains import get_domain
    from tbhpc.env.episode import run_episode
    from tbhpc.env.judge import KeywordJudge
    from tbhpc.env.users import ScriptedUser
    from tbhpc.policy.scripted import OraclePolicy

    policy = _RecordingPolicy(tokenizer, OraclePolicy(ask=ask))
    user, judge = ScriptedUser(), KeywordJudge()
    out = []
    for i, task in enumerate(tasks):
        res = run_episode(task, get_domain(task.domain), policy, user, judge, seed=seed + i)
        if res.status == "ok" and res.passed:
            policy.last.verify(res.messages)
            tr = policy.last
            out.append(Episode(tr.tokens, tr.loss_mask, tr.logprobs, group=i, reward=1.0, task_id=task.id))
    if not out:
        raise UserError("warm start: the oracle passed none of the given tasks")
    return out


def sft(model_dir: str, out_dir: str, tasks: list, phases: list[Phase], batch_tokens: int = 4096, seed: int = 0,
        threads: int = 1, log=print, ask: bool = False, progress: bool = False, packed: bool = True,
        extra_tasks: list | None = None, max_seconds: float | None = None, gate=None) -> Path:
    """Fine-tune `model_dir` on oracle episodes of `tasks` (mean token NLL on generated tokens),
    phase after phase, and save to `out_dir` with its tokenizer; returns the path. Batches hold
    about `batch_tokens` tokens, packed into passes of that size; `packed=False`: each pass holds
    whole episodes up to the batch's longest (on a CPU a packed pass's block mask costs the square
    of its length). `extra_tasks`: more tasks to learn from (other generator seeds, say).
    `max_seconds`: stop (and save) once the optimiser steps have taken this long (a baseline given
    the same wall time as another method). `gate` (a `warm_select.SelectGate`): every `gate.every`
    steps it evaluates the model on held-out tasks and ends a phase where it says so (`Phase.gate`);
    the model saved is the checkpoint it chose.

    Curriculum (a phase with `window`): a model trained from scratch has to learn to copy values
    (emails, ids) from the conversation; over 1,600-token episodes, 40% of them a constant system
    prompt, its attention is too diffuse to find them, and short windows make copying learnable."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tbhpc.train.logprobs import token_logprobs
    from tbhpc.train.packing import pack

    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    examples = oracle_examples(tok, list(tasks) + list(extra_tasks or []), seed, ask)
    rng = random.Random(seed)
    if gate is not None and phases and phases[0].gate == "plateau":
        gate(0, model, tok, "plateau")   # the starting point is on the curve (and wins if SFT never beats it)
    model.train()
    total_steps = sum(p.steps for p in phases)
    bar = _progress(total_steps, f"sft on {len(examples)} oracle episodes") if progress else None
    done, t_start = 0, time.perf_counter()
    for n_phase, phase in enumerate(phases, 1):
        source = [after_system(e, tok, phase.window) for e in examples] if phase.window else examples
        opt = torch.optim.AdamW(model.parameters(), lr=phase.lr, weight_decay=0.0)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, phase.factor)
        for step in range(1, phase.steps + 1):
            if max_seconds is not None and time.perf_counter() - t_start >= max_seconds:
                break
            batch, n = [], 0
            while n < batch_tokens:
                e = source[rng.randrange(len(source))]
                batch.append(e)
                n += len(e.tokens)
            loss_sum, count = 0.0, 0
            opt.zero_grad()
            packs = pack(batch, [0.0] * len(batch), batch_tokens if packed else max(len(e.tokens) for e in batch))
            total = sum(p.n_loss_tokens for p in packs)
            for p in packs:
                lp = token_logprobs(model, p)
                loss = -(lp * p.loss_mask).sum() / total
                loss.backward()
                loss_sum += float(loss.item())
                count += p.n_loss_tokens
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            done += 1
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{loss_sum:.3f}")
            if step % min(50, max(1, phase.steps // 10)) == 0 or step == phase.steps:
                log(f"sft phase {n_phase}/{len(phases)} step {step}/{phase.steps} ({done}/{total_steps}): "
                    f"loss {loss_sum:.4f} over {count} tokens")
            if gate is not None and done % gate.every == 0 and gate(done, model, tok, phase.gate):
                break         # the gate ends this phase (in the band, or past its plateau); the next one starts here
        if max_seconds is not None and time.perf_counter() - t_start >= max_seconds:
            log(f"sft: time budget {max_seconds:.0f} s reached after {done} of {total_steps} steps")
            break
    if bar is not None:
        bar.close()
    if gate is not None:
        gate.restore(model)           # the chosen checkpoint, not the last one evaluated
    out = Path(out_dir)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def after_system(e: Episode, tok, window: int) -> Episode:
    """The first `window` tokens after the system turn of an example (its masks and logprobs)."""
    import numpy as np
    start_ids = np.nonzero(np.asarray(e.tokens) == tok.convert_tokens_to_ids("<|im_start|>"))[0]
    s = int(start_ids[1]) if len(start_ids) > 1 else 0
    end = s + window if window else None
    return Episode(e.tokens[s:end], e.loss_mask[s:end], e.logprobs[s:end], group=e.group, reward=e.reward, task_id=e.task_id)


class _progress:
    """A rich progress bar (the project's one progress library) with the calls the loop makes."""

    def __init__(self, total: int, desc: str):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
        self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                             TextColumn("{task.fields[loss]}"), TimeRemainingColumn(), refresh_per_second=0.5)
        self._task = self._bar.add_task(desc, total=total, loss="")
        self._bar.start()

    def update(self, n: int) -> None:
        self._bar.advance(self._task, n)

    def set_postfix(self, loss: str) -> None:
        self._bar.update(self._task, loss=f"loss {loss}")

    def close(self) -> None:
        self._bar.stop()
