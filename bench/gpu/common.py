"""What the parts of bench/gpu_check.sh share: the device they run on (the CPU in a rehearsal, with
sizes small enough for `make test`) and how a failure is printed (one line, also for an exception
whose message is empty)."""
import os

from tbhpc.serve.vllm_ext.tbhpc_wire import first_line  # noqa: F401  (one line of an exception, for every part)

REHEARSAL = bool(os.environ.get("TBHPC_GPU_REHEARSAL"))
DEVICE = "cpu" if REHEARSAL else "cuda"


def scale(gpu, rehearsal):
    """The GPU's figure, or the rehearsal's."""
    return rehearsal if REHEARSAL else gpu
