"""Part `nccl`, 3: torch's fused AdamW (what the trainer asks DeepSpeed for on a GPU: no nvcc build), timed."""
import time

import torch
from common import DEVICE, scale

p = torch.nn.Parameter(torch.randn(scale(64 << 20, 1 << 16), device=DEVICE))    # 256 MB of fp32 master weights
opt = torch.optim.AdamW([p], lr=1e-6, fused=True)
p.grad = torch.randn_like(p)
opt.step()
sync = torch.cuda.synchronize if DEVICE == "cuda" else (lambda: None)
sync()
t0 = time.perf_counter()
for _ in range(10):
    opt.step()
sync()
s = (time.perf_counter() - t0) / 10
print(f"fused AdamW on {DEVICE}: {p.numel() / 1e6:.1f}M parameters in {s * 1e3:.2f} ms a step; a rank's 1.67B of "
      f"the reference (16 ranks): ~{1.67e9 / p.numel() * s:.2f} s", flush=True)
