"""The memory options of a training step change where memory goes, never the update: sequence
parallelism (Ulysses over gloo: its all-to-all and all-gather run on CPU process groups), tiled
MLPs, gradient checkpoints kept in host memory and ZeRO offload each give the plain step's loss,
gradient norm and weights (tests/train_rank.py runs one DeepSpeed update per rank)."""
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import MACHINE_NOTES, cpu_class, run_ranks
from tbhpc.train.longseq import sp_slice
from tbhpc.train.packing import pack
from tbhpc.rollout.buffer import Episode

HERE = Path(__file__).parent


def _update(model, out: Path, world: int, **overrides):
    prefix = str(out / f"w{world}-{'-'.join(f'{k}{v}' for k, v in sorted(overrides.items())) or 'plain'}")
    run_ranks(lambda r: [sys.executable, str(HERE / "train_rank.py"), str(model), str(world), str(r), "0", prefix,
                         "3", "token-mean", json.dumps(overrides)], world)
    return json.loads(Path(prefix + ".json").read_text()), torch.load(prefix + ".pt")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """4 attention heads over 2 key/value heads (sp 2 divides both), 4 layers, hidden 128."""
    from tbhpc.policy.tiny import build_tiny_model
    return build_tiny_model(tmp_path_factory.mktemp("sp-model"), size="demo")


@pytest.fixture(scope="module")
def plain(model_dir, tmp_path_factory):
    return _update(model_dir, tmp_path_factory.mktemp("longseq"), 1)


def _same(plain, other, what, rel=1e-4):
    (a, wa), (b, wb) = plain, other
    assert b["loss_tokens"] == a["loss_tokens"]
    assert b["loss"] == pytest.approx(a["loss"], rel=rel)
    assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=rel)
    diff = max((wa[k] - wb[k]).abs().max().item() for k in wa)
    MACHINE_NOTES.append(f"{what}: loss {a['loss']:.6g} vs {b['loss']:.6g}, |g| {a['grad_norm']:.6g} vs "
                         f"{b['grad_norm']:.6g}, max |dw| {diff:.1e}")
    assert diff < 1e-5, (diff, cpu_class())        # an update moves weights ~1e-3 (lr 1e-3, Adam)


pytestmark = [pytest.mark.slow, pytest.mark.kernels]


def test_the_deepspeed_step_is_the_plain_torch_gradient(plain, model_dir):
    """The reference the other tests compare with is itself right: ZeRO-3's gradient norm (the chunked
    head inside the engine, the tied embedding reduced once) is that of the same loss in plain torch
    through the [T, V] route."""
    from transformers import AutoModelForCausalLM

    from train_rank import batch
    from tbhpc.train.grpo import policy_loss
    from tbhpc.train.logprobs import full_logprobs
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    eps, adv = batch(model.config.vocab_size)
    packs = pack(eps, adv, 96)
    total = sum(p.n_loss_tokens for p in packs)
    for p in packs:
        loss, _ = policy_loss(full_logprobs(model, p), p.behaviour, p.advantages, p.loss_mask, total, 0.2, 0.2, 1, 3.0)
        loss.backward()
    norm = torch.sqrt(sum((q.grad ** 2).sum() for q in model.parameters())).item()
    assert model.config.tie_word_embeddings
    assert plain[0]["grad_norm"] == pytest.approx(norm, rel=1e-4)


def test_sequence_parallel_2_ranks_is_the_single_rank_step(plain, model_dir, tmp_path):
    """2 gloo ranks, sp_size 2: every micro-batch split between them (all-to-all over gloo)."""
    sp = _update(model_dir, tmp_path, 2, sp_size=2)
    _same(plain, sp, "sp 2 vs 1 rank")
    assert sp[0]["sp"] == 2 and sp[0]["tokens"] < plain[0]["tokens"] * 0.6     # rank 0 held about half of every row


def test_tiled_mlp_is_the_untiled_step(plain, model_dir, tmp_path):
    tiled = _update(model_dir, tmp_path, 1, tiled_mlp=True)
    _same(plain, tiled, "tiled MLP vs plain")
    assert tiled[0]["used"].get("mlp_tiles", 0) > 4 * 3      # 4 layers, rows of up to 130 tokens: > 1 tile each


def test_offloaded_checkpoints_are_the_plain_step(plain, model_dir, tmp_path):
    off = _update(model_dir, tmp_path, 1, checkpoint_offload=True)
    _same(plain, off, "checkpoints offloaded vs plain")
    assert off[0]["used"].get("offloaded_recomputes", 0) >= 4 * off[0]["micro"]     # every layer of every pass
    # one host buffer per layer, reused by every pass (grown at most once per longer pass), not one per pass:
    # a GPU's pinned allocator would round and cache each of those for the life of the process
    assert off[0]["micro"] > 1 and 4 <= off[0]["used"]["host_buffers"] < 4 * off[0]["micro"], off[0]


def test_zero_offload_of_optimizer_and_parameters_is_the_plain_step(plain, model_dir, tmp_path):
    off = _update(model_dir, tmp_path, 2, offload_optimizer=True, offload_params=True)
    _same(plain, off, "ZeRO offload vs plain")
    assert off[0]["offload"] == [True, True] and plain[0]["offload"] == [False, False]


def test_all_of_them_together(plain, model_dir, tmp_path):
    _same(plain, _update(model_dir, tmp_path, 2, sp_size=2, tiled_mlp=True, checkpoint_offload=True,
                         logprob_chunk=16), "sp 2 + tiled + offloaded checkpoints + chunk 16 vs plain")


def test_sp_slices_put_together_are_the_micro_batch():
    rng = np.random.default_rng(0)
    eps = [Episode(rng.integers(0, 50, n), (rng.random(n) < 0.5).astype(np.uint8), rng.normal(size=n), 0, 0.0)
           for n in (9, 14)]
    mb = pack(eps, [1.0, -0.5], budget=100, seq_weights=True)[0]       # 23 tokens: 3 slices of 8 (1 padded)
    parts = [sp_slice(mb, r, 3, count_episodes=r == 0) for r in range(3)]
    assert [p.input_ids.shape[1] for p in parts] == [8, 8, 8]
    ids = torch.cat([p.input_ids[0] for p in parts])
    targets = torch.cat([p.targets for p in parts])
    assert torch.equal(ids[:23], mb.input_ids[0]) and torch.equal(targets[:22], mb.input_ids[0, 1:])
    for name in ("loss_mask", "behaviour", "advantages", "weights"):
        joined = torch.cat([getattr(p, name) for p in parts])
        assert torch.equal(joined[:22], getattr(mb, name)) and not joined[22:].any(), name
    assert sum(p.n_loss_tokens for p in parts) == mb.n_loss_tokens
    assert parts[0].episodes == mb.episodes and parts[1].episodes == parts[2].episodes == []
    pos = torch.cat([p.position_ids[0] for p in parts])
    assert torch.equal(pos[:23], mb.position_ids[0]) and pos[23] == pos[22] + 1
