"""Measure what the memory plan predicts: a real DeepSpeed training step of a Qwen3-architecture
model of a given shape (random weights, made here), its peak memory per phase, beside the plan's
terms for the same config. `python -m tbhpc.train.memcheck '{"hidden": 512, ...}'` prints JSON.

Why a subprocess per case: peak resident memory is a property of a process (memstat.py); one
process per shape keeps one case's allocations out of the next one's figures. Run it under
`MALLOC_MMAP_THRESHOLD_=65536` (glibc then maps every large tensor on its own and unmaps it on
free, so resident memory follows the live tensors). On a GPU node the same code reads the CUDA
allocator's peak instead.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

DEFAULTS = {"hidden": 256, "layers": 4, "heads": 4, "kv_heads": 2, "head_dim": 64, "intermediate": 768,
            "vocab": 16384, "tokens": 1024, "steps": 2, "zero_stage": 3, "gradient_checkpointing": True,
            "logprob_chunk": 2048, "tiled_mlp": False, "checkpoint_offload": False, "threads": 1}


def build_model(out: Path, c: dict) -> Path:
    """A random Qwen3 of the case's shape, saved as safetensors (no tokenizer: the step needs none)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config
    config = Qwen3Config(vocab_size=c["vocab"], hidden_size=c["hidden"], num_hidden_layers=c["layers"],
                         num_attention_heads=c["heads"], num_key_value_heads=c["kv_heads"], head_dim=c["head_dim"],
                         intermediate_size=c["intermediate"], tie_word_embeddings=bool(c.get("tied", False)),
                         max_position_embeddings=1 << 17)
    torch.manual_seed(0)
    gpu = c.get("device", "cpu") == "cuda"     # made where it runs, in the dtype it trains in
    with torch.device("cuda" if gpu else "cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16 if gpu else torch.float32)
    model.save_pretrained(out)
    del model
    return out


def _stub_tokenizer(model_dir: Path) -> None:
    """Engine loads a tokenizer beside the model: a minimal one (ids are random in the step)."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>")),
                                  unk_token="<unk>", eos_token="<unk>")
    tok.save_pretrained(model_dir)


def measure(c: dict) -> dict:
    """Run the case in this process: the phases' peaks in bytes above the process's baseline. On a GPU
    (`"device": "cuda"`): bf16, NCCL, the CUDA allocator's peaks, and the plan of one GPU (its reserve
    reported apart: the allocator's figures do not hold the CUDA context)."""
    import numpy as np
    import torch

    gpu = c.get("device", "cpu") == "cuda"
    if not gpu:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        torch.set_num_threads(int(c["threads"]))
    import deepspeed

    from tbhpc.plan.memory import plan
    from tbhpc.rollout.buffer import Episode
    from tbhpc.train import memstat
    from tbhpc.train.config import TrainConfig
    from tbhpc.train.dist import bind_gpu
    from tbhpc.train.engine import DistEnv, Engine
    from tbhpc.train.packing import pack

    with tempfile.TemporaryDirectory(dir=c.get("tmp")) as tmp:
        model_dir = Path(c["model_dir"]) if c.get("model_dir") else Path(tmp) / "model"
        if not (model_dir / "config.json").is_file():       # a case may name a model an earlier case built
            build_model(model_dir, c)
            _stub_tokenizer(model_dir)
        cfg = TrainConfig(model=str(model_dir), pool="-", zero_stage=int(c["zero_stage"]), dtype="bf16" if gpu else "fp32",
                          gradient_checkpointing=bool(c["gradient_checkpointing"]), microbatch_tokens=int(c["tokens"]),
                          logprob_chunk=int(c["logprob_chunk"]), tiled_mlp=bool(c["tiled_mlp"]),
                          checkpoint_offload=bool(c["checkpoint_offload"]), torch_threads=int(c["threads"]),
                          gpus_per_node=1 if gpu else 0, gpu_memory_gb=float(c.get("gpu_memory_gb", 80)))
        env = DistEnv.from_environ()
        if gpu:
            torch.cuda.set_device(bind_gpu(env, torch.cuda.device_count()))
        else:
            env.export()
            deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
        deepspeed.init_distributed(dist_backend="nccl" if gpu else "gloo", verbose=False)
        _warm_imports()
        base = torch.cuda.memory_allocated() if gpu else memstat.rss()
        memstat.reset_peak(gpu)
        eng = Engine(cfg, env)
        init_peak = memstat.peak(gpu) - base
        after_init = (torch.cuda.memory_allocated() if gpu else memstat.rss()) - base
        rng = np.random.default_rng(0)
        n = int(c["tokens"])
        mask = np.ones(n, np.uint8)
        mask[0] = 0
        ep = Episode(rng.integers(0, c["vocab"], n), mask, np.full(n, -3.0), 0, 0.0)
        steps = []
        for _ in range(int(c["steps"])):
            st = eng.update(pack([ep], [1.0], n))
            steps.append(st.peak_bytes - base)
        p = plan(cfg)
        reserve = sum(t.bytes for t in p.terms if t.name == "reserve")
        return {"case": c, "params": p.shape.params, "init_peak": init_peak, "after_init": after_init,
                "step_peaks": steps, "plan_total": p.total - reserve, "plan_reserve": reserve, "plan_phase": p.phase,
                "plan_terms": {t.name: t.bytes for t in p.terms}, "cpu": _cpu(),
                "device": torch.cuda.get_device_name() if gpu else "cpu"}


def _warm_imports() -> None:
    """Import what the Engine imports lazily (the model's code, ZeRO-3, the tokenizer stack), so that the
    baseline holds the interpreter's code and the phases hold only tensors."""
    import deepspeed.runtime.zero.stage3  # noqa: F401
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, Qwen3Config  # noqa: F401
    tiny = Qwen3Config(vocab_size=32, hidden_size=8, num_hidden_layers=1, num_attention_heads=1, num_key_value_heads=1,
                       head_dim=8, intermediate_size=8)
    model = AutoModelForCausalLM.from_config(tiny)
    model(input_ids=torch.zeros((1, 4), dtype=torch.long)).logits.sum().backward()
    del model


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "?"


def run_case(case: dict, timeout: float = 900) -> dict:
    """The case in a fresh process (1 rank: gloo on CPU, NCCL with `"device": "cuda"`): its JSON result."""
    import subprocess

    from tbhpc.train.dist import free_port_pair
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": str(case.get("threads", 1)),
           "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port_pair())}
    if case.get("device", "cpu") != "cuda":
        env["DS_ACCELERATOR"] = "cpu"
    proc = subprocess.run([sys.executable, "-m", "tbhpc.train.memcheck", json.dumps(case)], env=env, text=True,
                          capture_output=True, timeout=timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode or not lines:
        raise RuntimeError(f"memcheck {case}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1])


def real_logprobs(vocab: int, hidden: int, tokens: int, chunk: int, route: str, device: str = "cpu") -> int:
    """Peak bytes (above the inputs; their gradients counted) of the logprobs of `tokens` positions and
    their backward: fp32 resident memory on a CPU, bf16 allocated memory on a GPU (`device` "cuda");
    route "chunked" or "full" (the [T, V] fp32 route)."""
    import torch

    from tbhpc.train import memstat
    from tbhpc.train.logprobs import chunked_logprobs
    gpu = device == "cuda"
    dt = torch.bfloat16 if gpu else torch.float32
    torch.manual_seed(0)
    h = torch.randn(tokens, hidden, dtype=dt, device=device, requires_grad=True)
    w = (torch.randn(vocab, hidden, dtype=dt, device=device) * 0.02).requires_grad_(True)
    t = torch.randint(0, vocab, (tokens,), device=device)
    base = torch.cuda.memory_allocated() if gpu else memstat.rss()
    memstat.reset_peak(gpu)
    if route == "chunked":
        lp = chunked_logprobs(h, w, t, chunk)[:, 0]
    else:
        lp = torch.log_softmax((h @ w.T).float(), -1).gather(1, t[:, None]).squeeze(1)
    lp.sum().backward()
    return memstat.peak(gpu) - base


def run_logprobs(vocab: int, hidden: int, tokens: int, chunk: int, route: str, timeout: float = 600,
                 device: str = "cpu") -> int:
    """real_logprobs in a fresh process (its own peak)."""
    import subprocess
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": "2"}
    arg = json.dumps({"vocab": vocab, "hidden": hidden, "tokens": tokens, "chunk": chunk, "route": route,
                      "device": device})
    proc = subprocess.run([sys.executable, "-m", "tbhpc.train.memcheck", "--logprobs", arg], env=env, text=True,
                          capture_output=True, timeout=timeout)
    if proc.returncode:
        raise RuntimeError(f"memcheck --logprobs {arg}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
    return int(proc.stdout.split()[-1])


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--logprobs":
        print(real_logprobs(**json.loads(argv[1])), flush=True)
        return 0
    case = {**DEFAULTS, **(json.loads(argv[0]) if argv else {})}
    result = measure(case)
    print(json.dumps(result), flush=True)
    os._exit(0)      # gloo/DeepSpeed teardown can abort a finished process (engine.Engine.leave)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


# ---- the same terms on fake tensors (no memory is allocated: 27B widths on any machine) -------------
def _tracked_peak(fn) -> tuple[int, int]:
    """(peak bytes, bytes held after `fn`) of the tensors `fn` creates, under torch's MemTracker."""
    from torch.distributed._tools.mem_tracker import MemTracker
    mt = MemTracker()
    with mt:
        fn()
    total = lambda snap: sum(v.get("Total", 0) for v in snap.values())     # noqa: E731
    return total(mt.get_tracker_snapshot("peak")), total(mt.get_tracker_snapshot("current"))


def _activations(snapshot) -> int:
    """Activations and temporaries of a MemTracker snapshot (parameters, gradients, optimizer states left out)."""
    return sum(b for dev in snapshot.values() for k, b in dev.items() if getattr(k, "name", "") in ("ACT", "TEMP"))


def _activation_peak_mode(tracker):
    """A dispatch mode that reads the tracker after every op and keeps the highest activation bytes (the
    tracker's own peak is that of the total, parameters and gradients included, which at 27B width
    falls at another moment than the activations' peak)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class PeakActivations(TorchDispatchMode):
        peak = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            self.peak = max(self.peak, _activations(tracker.get_tracker_snapshot("current")))
            return out
    return PeakActivations()


def fake_layer(shape, tokens: int, dtype: str = "bfloat16", checkpoint: bool = True) -> dict:
    """One Qwen3 decoder layer of `shape` (plan.shape.ModelShape) on `tokens` tokens, on fake tensors: the
    activation bytes per token it holds after its forward (its output included) and at the peak of its
    backward (the recompute under checkpointing, and the gradients)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker
    from transformers import Qwen3Config
    from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer, Qwen3RotaryEmbedding

    dt = getattr(torch, dtype)
    cfg = Qwen3Config(hidden_size=shape.hidden, num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
                      head_dim=shape.head_dim, intermediate_size=shape.intermediate, num_hidden_layers=1, vocab_size=8)
    cfg._attn_implementation = "sdpa"
    with FakeTensorMode():
        old = torch.get_default_dtype()
        torch.set_default_dtype(dt)
        try:
            layer = Qwen3DecoderLayer(cfg, 0)
        finally:
            torch.set_default_dtype(old)
        x = torch.randn(1, tokens, shape.hidden, dtype=dt, requires_grad=True)
        pos = torch.arange(tokens)[None]
        cos_sin = Qwen3RotaryEmbedding(cfg)(x, pos)
        mt = MemTracker()
        mt.track_external(layer)

        def f(a):
            return layer(a, attention_mask=None, position_embeddings=cos_sin, position_ids=pos)
        with mt:
            y = torch.utils.checkpoint.checkpoint(f, x, use_reentrant=False) if checkpoint else f(x)
            after = _activations(mt.get_tracker_snapshot("current"))
            with _activation_peak_mode(mt) as watch:
                y.backward(torch.ones_like(y))
    return {"saved_per_token": after / tokens, "work_per_token": max(watch.peak, after) / tokens}


def fake_logprobs(vocab: int, hidden: int, tokens: int, chunk: int, route: str = "chunked",
                  dtype: str = "bfloat16") -> int:
    """Peak bytes of the logprobs and their backward for `tokens` positions through a [vocab, hidden]
    head, on fake tensors: route "chunked" (tbhpc.train.logprobs) or "full" (the [T, V] fp32 route),
    the hidden states and the head's weight left out (their gradients, which the backward makes, counted)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from tbhpc.train.logprobs import chunked_logprobs
    dt = getattr(torch, dtype)
    with FakeTensorMode():
        h = torch.randn(tokens, hidden, dtype=dt, requires_grad=True)
        w = torch.randn(vocab, hidden, dtype=dt, requires_grad=True)
        t = torch.randint(0, vocab, (tokens,))

        def run():
            if route == "chunked":
                lp = chunked_logprobs(h, w, t, chunk)[:, 0]
            else:
                lp = torch.log_softmax((h @ w.T).float(), -1).gather(1, t[:, None]).squeeze(1)
            lp.sum().backward()
        peak, _ = _tracked_peak(run)
    return int(peak)
