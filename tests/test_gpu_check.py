"""bench/gpu_check.sh, the script a GPU machine runs first, rehearsed on the CPU: every default part
runs (small sizes, gloo for NCCL), so that a bug in the script or in a part (a child spawned from a
script on stdin, an error handler that fails on an empty message) fails here and not on the GPU."""
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PARTS = ("tests", "logprobs", "memory case 0", "nccl init", "nccl timeout", "fused adamw", "broadcast")


def _check(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "bench/gpu_check.sh", *args], cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "TBHPC_PY": sys.executable, **env})


def test_the_gpu_check_rehearses_every_default_part_on_the_cpu():
    out = _check("--rehearsal")
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    for part in PARTS:
        assert f"\n  {part}: ok (" in out.stdout, (part, out.stdout[-3000:])
    assert "5 passed, 1 skipped" in out.stdout and out.stdout.rstrip().endswith("all ok")


def test_a_failing_part_is_one_line_and_the_others_still_run():
    out = _check("--rehearsal", "nccl", TBHPC_PY="false")
    assert out.returncode == 1
    failed = [ln for ln in out.stdout.splitlines() if ln.endswith("FAILED (exit 1)")]
    assert len(failed) == 4 and out.stdout.rstrip().endswith("4 step(s) FAILED"), out.stdout
    bad = _check("nccll")
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "unknown part 'nccll'" in bad.stderr
