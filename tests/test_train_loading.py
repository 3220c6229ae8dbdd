"""A ZeRO-3 trainer rank builds its model partitioned (tbhpc/train/loading.py): each rank's memory
while loading is its share of the model plus one module's tensors, not the whole model; the weights
are the checkpoint's, tied heads included."""
import json
import sys
from pathlib import Path

import pytest

from helpers import MACHINE_NOTES, cpu_class, run_ranks

HERE = Path(__file__).parent
pytestmark = pytest.mark.slow


def _load(model: Path, world: int, mode: str, out: Path, check: bool = False) -> dict:
    path = out / f"{mode}-{world}.json"
    run_ranks(lambda r: [sys.executable, str(HERE / "load_rank.py"), str(model), mode, str(path)] + (["check"] if check else []),
              world, timeout=600, env={"MALLOC_MMAP_THRESHOLD_": "65536"})
    return json.loads(path.read_text())


@pytest.mark.kernels
@pytest.mark.parametrize("tied", [True, False])
def test_partitioned_weights_are_the_checkpoints(tmp_path, tied):
    from tbhpc.train.memcheck import build_model
    model = build_model(tmp_path / "m", {"hidden": 64, "layers": 2, "heads": 2, "kv_heads": 1, "head_dim": 32,
                                         "intermediate": 96, "vocab": 300, "tied": tied})
    for world in (1, 3):
        r = _load(model, world, "partitioned", tmp_path, check=True)
        assert r["mismatched"] == [], (world, r["mismatched"])
        assert r["dtypes"] == ["float32"], (world, r["dtypes"], cpu_class())     # asked for, on every CPU class


@pytest.fixture(scope="module")
def half_billion(tmp_path_factory):
    """A 0.5B-parameter Qwen3 (2.0 GB in fp32), random weights, saved here as one safetensors file."""
    from tbhpc.train.memcheck import build_model
    return build_model(tmp_path_factory.mktemp("half-billion") / "m",
                       {"hidden": 1536, "layers": 16, "heads": 12, "kv_heads": 4, "head_dim": 128, "intermediate": 4096,
                        "vocab": 32000})


def test_two_ranks_each_hold_their_half_while_loading_half_a_billion_parameters(half_billion, tmp_path):
    """Each rank's peak resident memory while loading <= 0.6 x the model's bytes + the constant
    2 x its largest tensor (that tensor gathered on every rank, and rank 0's read buffer) + 64 MB;
    loading the whole model on each rank (what ranks did before, up to its first use) is above 1x."""
    from tbhpc.train.loading import checkpoint_index
    index = checkpoint_index(half_billion)
    nbytes = sum(e["data_offsets"][1] - e["data_offsets"][0] for _, e, _ in index.values())
    largest = max(e["data_offsets"][1] - e["data_offsets"][0] for _, e, _ in index.values())
    part = _load(half_billion, 2, "partitioned", tmp_path)
    whole = _load(half_billion, 2, "whole", tmp_path)
    assert part["params"] > 5e8
    bound = 0.6 * nbytes + 2 * largest + 64e6
    MACHINE_NOTES.append(f"loading {part['params'] / 1e9:.2f}B parameters ({nbytes / 1e9:.2f} GB) on 2 ranks: partitioned "
                         f"peaks {[round(p / 1e9, 2) for p in part['peaks']]} GB (bound {bound / 1e9:.2f}), whole "
                         f"{[round(p / 1e9, 2) for p in whole['peaks']]} GB")
    assert max(part["peaks"]) <= bound
    assert min(whole["peaks"]) > nbytes
