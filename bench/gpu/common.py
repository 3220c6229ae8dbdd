"""What the parts of bench/gpu_check.sh share: the device they run on (the CPU in a rehearsal, with
sizes small enough for `make test`) and how a failure is printed (one line, also for an exception
whose message is empty)."""
import os

REHEARSAL = bool(os.environ.get("TBHPC_GPU_REHEARSAL"))
DEVICE = "cpu" if REHEARSAL else "cuda"


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:160]}" if text else type(exc).__name__


def scale(gpu, rehearsal):
    """The GPU's figure, or the rehearsal's."""
    return rehearsal if REHEARSAL else gpu
