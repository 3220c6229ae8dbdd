"""Part `logprobs`: the trainer's output head at 27B width (hidden 5,120, V 151,936, bf16) on one GPU,
chunked against the [T, V] route, T = 4k..32k: measured peak beside the plan's terms."""
from common import DEVICE, REHEARSAL, first_line, scale

from tbhpc.plan.memory import COMM_BYTES, GB, Layout, head_phase, read_shape
from tbhpc.train.config import TrainConfig
from tbhpc.train.memcheck import run_logprobs

s = read_shape("jobs/models/qwen3-27b-class")
lay = Layout.of(TrainConfig(gpus_per_node=8, dtype="bf16"))
vocab, hidden = scale((s.vocab, s.hidden), (4096, 256))
for t in scale((4096, 8192, 16384, 32768), (256,)):
    planned = sum(x.bytes for x in head_phase(s, lay, t) if x.name in ("logprobs", "head gradient")) \
        - s.head_params * 2 * COMM_BYTES           # ZeRO's reduce-scatter copies are not part of this call
    chunked = run_logprobs(vocab, hidden, t, 2048, "chunked", device=DEVICE, timeout=30)
    try:
        full = f"{run_logprobs(vocab, hidden, t, 2048, 'full', device=DEVICE, timeout=30) / GB:.2f} GB"
    except RuntimeError as exc:
        full = "out of memory" if "out of memory" in str(exc).lower() else f"failed: {first_line(exc)}"
    print(f"logprobs T {t:>6,}: chunked {chunked / GB:6.2f} GB (plan {planned / GB:.2f}"
          f"{', not comparable in a rehearsal' if REHEARSAL else ''})   [T, V] route {full}", flush=True)
