"""One DeepSpeed GRPO update across a real gloo process group: the same global batch split over
1, 2 and 3 ranks (uneven token counts, unequal micro-batch counts per rank) gives the same loss,
the same gradient norm and the same weights. Runs tests/train_rank.py once per rank."""
import json
import sys
from pathlib import Path

import pytest
import torch

from helpers import cpu_class, run_ranks

pytestmark = [pytest.mark.slow, pytest.mark.kernels]
HERE = Path(__file__).parent


def _updates(tiny_dir, out, worlds, loss_agg="token-mean"):
    res = {}
    for world in worlds:
        prefix = str(out / f"w{world}-{loss_agg}")
        run_ranks(lambda r: [sys.executable, str(HERE / "train_rank.py"), str(tiny_dir), str(world), str(r),
                             "0", prefix, "3", loss_agg], world)
        res[world] = (json.loads(Path(prefix + ".json").read_text()), torch.load(prefix + ".pt"))
    return res


@pytest.fixture(scope="module")
def updates(tiny_dir, tmp_path_factory):
    return _updates(tiny_dir, tmp_path_factory.mktemp("rank-split"), (1, 2, 3))


@pytest.mark.parametrize("world", [2, 3])
def test_the_update_is_the_same_on_1_2_and_3_ranks(updates, tiny_dir, world):
    from transformers import AutoModelForCausalLM
    (one, w1), (many, wn) = updates[1], updates[world]
    assert many["loss"] == pytest.approx(one["loss"], rel=1e-5)
    assert many["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-5)
    before = AutoModelForCausalLM.from_pretrained(tiny_dir).state_dict()
    moved = max((w1[k] - before[k]).abs().max().item() for k in before)
    diff = max((w1[k] - wn[k]).abs().max().item() for k in w1)
    from helpers import MACHINE_NOTES
    MACHINE_NOTES.append(f"rank split: 1 vs {world} gloo ranks: loss {one['loss']:.6g} vs {many['loss']:.6g}, "
                         f"max |dw| {diff:.1e} (update {moved:.1e})")
    assert moved > 1e-4 and diff < moved * 1e-2, (moved, diff, cpu_class())   # measured: moved 1e-3, diff <= 1.1e-6


def test_no_rank_builds_deepspeeds_shared_memory_op(updates):
    """Training all-reduces through gloo; DeepSpeed's shm op (inference all-reduce only) would cost a
    ~25 s C++ build on each new environment (tbhpc.train.engine)."""
    assert not any(info["shm_op_built"] for info, _ in updates.values())


def test_seq_mean_aggregation_is_the_same_on_1_and_3_ranks_and_differs_from_token_mean(updates, tiny_dir, tmp_path):
    """seq-mean-token-mean divides by the step's *global* episode count: 3 ranks holding different
    episodes give the single rank's loss and weights; and it is another loss than token-mean."""
    seq = _updates(tiny_dir, tmp_path, (1, 3), "seq-mean-token-mean")
    (one, w1), (three, w3) = seq[1], seq[3]
    assert three["loss"] == pytest.approx(one["loss"], rel=1e-5)
    diff = max((w1[k] - w3[k]).abs().max().item() for k in w1)
    assert diff < 1e-5, (diff, cpu_class())      # 1% of the update (lr 1e-3, Adam)
    assert abs(one["loss"] - updates[1][0]["loss"]) > 1e-3
