"""GPU tests (`pytest -m gpu`): the parts of tbhpc's real code that one GPU can run and the CPU suite
cannot show (NCCL, bf16 kernels, the CUDA allocator, fused AdamW, a bound device).

Without CUDA they skip, and CI (which has none) never runs them on a GPU. `bash bench/gpu_check.sh
--rehearsal`, which `make test` runs, plays them on the CPU (TBHPC_GPU_REHEARSAL=1), so that what CI
checks is these tests and the script around them, ready for the first GPU; `bash bench/gpu_check.sh
tests` runs them on one. They need no conftest (the GPU machine runs them with --noconftest) and no
model from a hub: each builds a small random Qwen3.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu
HERE = Path(__file__).parent


def _device() -> str:
    if torch.cuda.is_available() and os.environ.get("DS_ACCELERATOR", "") != "cpu":
        return "cuda"
    if os.environ.get("TBHPC_GPU_REHEARSAL"):
        return "cpu"
    pytest.skip("no CUDA device (bench/gpu_check.sh --rehearsal plays these on the CPU)")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from tbhpc.train.memcheck import _stub_tokenizer, build_model
    device = _device()
    out = tmp_path_factory.mktemp("gpu") / "qwen3"
    build_model(out, {"vocab": 4096, "hidden": 256, "layers": 2, "heads": 4, "kv_heads": 2, "head_dim": 64,
                      "intermediate": 768, "device": device})
    _stub_tokenizer(out)
    return out


def _engine_step(model_dir: Path, dtype: str, tmp_path: Path) -> dict:
    out = tmp_path / f"{dtype}.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if _device() == "cpu":
        env["DS_ACCELERATOR"] = "cpu"
    proc = subprocess.run([sys.executable, str(HERE / "gpu_rank.py"), str(model_dir), dtype, str(out)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and out.exists(), proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_a_zero3_bf16_step_against_its_fp32_reference(model_dir, tmp_path):
    """Partitioned loading puts the partitions on the device in bf16; the step's loss and gradient norm
    are the fp32 step's within bf16's precision; gradients accumulate and reduce in fp32."""
    bf16 = _engine_step(model_dir, "bf16", tmp_path)
    fp32 = _engine_step(model_dir, "fp32", tmp_path)
    device = _device()
    assert bf16["dtypes"] == ["bfloat16"] and fp32["dtypes"] == ["float32"], (bf16, fp32)
    assert bf16["partitions_on"] == [device] and bf16["device"].startswith(device), bf16
    assert (bf16["grad_accum"], bf16["communication"]) == ("float32", "float32"), bf16
    assert bf16["loss"] == pytest.approx(fp32["loss"], rel=0.05, abs=1e-3), (bf16, fp32)
    assert bf16["grad_norm"] == pytest.approx(fp32["grad_norm"], rel=0.05), (bf16, fp32)


def test_chunked_logprobs_against_the_full_route_in_bf16():
    """The trainer's head on the device in bf16: logprobs and entropies are the exact [T, V] route's on
    the same bf16 values (fp32 logits, not bf16 ones), gradients within bf16's rounding."""
    from tbhpc.train.logprobs import chunked_logprobs
    device = _device()
    torch.manual_seed(0)
    n, hid, vocab = 512, 256, 8192
    h = torch.randn(n, hid, device=device).to(torch.bfloat16).requires_grad_(True)
    w = (torch.randn(vocab, hid, device=device) * 0.25).to(torch.bfloat16).requires_grad_(True)
    t = torch.randint(0, vocab, (n,), device=device)
    out = chunked_logprobs(h, w, t, chunk=128, entropy=True)
    out[:, 0].sum().backward()
    lp = torch.log_softmax(h.detach().double() @ w.detach().double().T, -1)
    want = lp.gather(1, t[:, None]).squeeze(1)
    assert (out[:, 0].double() - want).abs().max().item() < 1e-4
    assert (out[:, 1].double() + (lp.exp() * lp).sum(-1)).abs().max().item() < 1e-2
    hd, wd = h.detach().double().requires_grad_(True), w.detach().double().requires_grad_(True)
    torch.log_softmax(hd @ wd.T, -1).gather(1, t[:, None]).sum().backward()
    assert torch.allclose(h.grad.double(), hd.grad, atol=2e-2) and torch.allclose(w.grad.double(), wd.grad, atol=5e-2)


def test_the_memory_plan_against_the_allocator():
    """A small Qwen3's step, one rank, ZeRO-3 (bf16 and the CUDA allocator's peak on a GPU): the plan must
    not promise less than the step takes (10% slack), nor twice as much."""
    from tbhpc.train.memcheck import run_case
    device = _device()
    case = {"device": device, "hidden": 1024, "layers": 4, "heads": 8, "kv_heads": 4, "head_dim": 128,
            "intermediate": 3072, "vocab": 32768, "tokens": 4096}
    if device == "cpu":
        pytest.skip("a rehearsal: tests/test_memory_plan.py holds the plan against CPU steps, and the check's "
                    "memory part runs this call")
    r = run_case(case, timeout=300)
    measured = max(r["step_peaks"])
    print(f"memory plan vs step on {r['device']}: plan {r['plan_total'] / 1e9:.3f} GB ({r['plan_phase']}), "
          f"measured {measured / 1e9:.3f} GB ({measured / r['plan_total']:.2f}x)")
    assert 0.5 * r["plan_total"] <= measured <= 1.10 * r["plan_total"], r


def test_the_weight_broadcast_settles_and_shuts_its_group_down():
    """The wire's own path on the device (NCCL refuses two ranks on one GPU: a group of one): the stream
    is sent, the closing byte says whole, and the group is shut down once everything landed."""
    from tbhpc.serve.vllm_ext import tbhpc_wire as wire
    device = _device()
    state = {f"w{i}": torch.randn(1 << 16, device=device).to(torch.bfloat16) for i in range(6)}
    meta = [wire.meta_of(n, t) for n, t in state.items()]
    group = wire.listen("127.0.0.1", 1, device, 60, "t" * 43)
    assert group.wait_joined(10)
    sent = wire.send(group, meta, state.values(), bucket_bytes=1 << 18)
    assert sent == sum(t.numel() * 2 for t in state.values()) and group.whole is True and group.pg is None
    assert group.buckets_done == len(wire.plan_buckets(meta, 1 << 18)) == 3     # 128 KiB tensors, 256 KiB buckets


def test_fused_adamw_steps_as_the_unfused_one():
    """The optimiser the trainer asks DeepSpeed for on a GPU (torch's AdamW, fused: no nvcc build)."""
    device = _device()
    torch.manual_seed(0)
    a = torch.nn.Parameter(torch.randn(4096, device=device))
    b = torch.nn.Parameter(a.detach().clone())
    fused = torch.optim.AdamW([a], lr=1e-3, fused=True)
    plain = torch.optim.AdamW([b], lr=1e-3, foreach=False)
    for _ in range(3):
        g = torch.randn_like(a)
        a.grad, b.grad = g.clone(), g.clone()
        fused.step()
        plain.step()
    assert torch.allclose(a, b, atol=1e-6)


def test_each_rank_drives_the_gpu_it_sees():
    """bind_gpu under the two Slurm bindings on this machine's GPUs (rehearsal: the environment alone)."""
    from tbhpc.train.dist import DistEnv, bind_gpu
    visible = torch.cuda.device_count() if _device() == "cuda" else 1
    environ = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "5", "SLURM_NTASKS_PER_NODE": "8",
               "CUDA_VISIBLE_DEVICES": "5", "MASTER_PORT": "29500"}
    assert bind_gpu(DistEnv.from_environ(environ), 1, environ) == 0 and environ["LOCAL_RANK"] == "0"
    if visible > 1:
        environ.update(SLURM_LOCALID="1", SLURM_NTASKS_PER_NODE=str(visible), CUDA_VISIBLE_DEVICES="")
        assert bind_gpu(DistEnv.from_environ(environ), visible, environ) == 1 and environ["LOCAL_RANK"] == "1"
