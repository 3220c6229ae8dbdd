"""The models the serving benchmarks run on (imported by weight_sync.py and weight_digest.py): the
tiny Qwen3 built here, SmolLM2-135M from `make model-smollm2` when present, or any HF directory."""
from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def add_model_args(ap) -> None:
    """--models, --dtypes, --threads: the options both serving benchmarks take."""
    ap.add_argument("--models", default="tiny,smollm2")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--threads", type=int, default=2)


def model_dirs(names: list[str], tmp: Path, console) -> dict[str, Path]:
    out = {}
    for name in names:
        if name == "tiny":
            from tbhpc.policy.tiny import build_tiny_model
            out[name] = build_tiny_model(tmp / "tiny", arch="qwen3")
        elif name == "smollm2":
            path = REPO / "build" / "models" / "smollm2-135m"
            if (path / "config.json").exists():
                out[name] = path
            else:
                console.print(f"[yellow]skipping smollm2: {path} missing (make model-smollm2)")
        else:
            out[name] = Path(name)
    return out
