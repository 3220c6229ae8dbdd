"""The in-process batched generator: same logits as transformers, same tokens alone or batched,
caches reused across turns and shared across conversations, errors delivered, weights swapped.

Models are the project's tiny builds (random weights where skill does not matter; the warm start
where a real episode should finish)."""
import random
import threading

import pytest
import torch
from transformers import AutoModelForCausalLM

from tbhpc.policy.batched import BatchedGenerator, check_against_transformers, sample_batch
from tbhpc.policy.generation import LocalGenerator, Sampling, recompute_logprobs
from tbhpc.policy.tiny import build_tiny_model

pytestmark = [pytest.mark.slow, pytest.mark.kernels]
GREEDY = Sampling(temperature=0.0, max_tokens=12)


def _perturbed(path):
    """Random weights with visible norms (fresh norms are all ones, which would hide a q/k-norm bug)."""
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.mul_(1 + 0.5 * torch.rand(p.shape, generator=g))
    return model


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_forward_matches_transformers(tmp_path, arch):
    model = _perturbed(build_tiny_model(tmp_path / arch, arch=arch, vocab_size=1000))
    ids = torch.randint(0, 1000, (160,), generator=torch.Generator().manual_seed(1)).tolist()
    assert check_against_transformers(model, ids, split=100) < 1e-4


def test_demo_size_forward_matches_transformers(tmp_path):
    model = _perturbed(build_tiny_model(tmp_path / "demo", size="demo"))
    ids = torch.randint(0, 1000, (120,), generator=torch.Generator().manual_seed(2)).tolist()
    assert model.config.num_hidden_layers == 4 and model.config.num_key_value_heads == 2
    assert check_against_transformers(model, ids, split=70) < 1e-4


@pytest.fixture(scope="module")
def model(tiny_dir):
    return _perturbed(tiny_dir)


def _prompts(n, length=80, seed=3):
    rng = random.Random(seed)
    shared = [rng.randrange(5, 3000) for _ in range(40)]          # a common "system prompt"
    return [shared + [rng.randrange(5, 3000) for _ in range(length - 40)] for _ in range(n)]


def _concurrently(gen, prompts, sampling, seeds):
    out = [None] * len(prompts)

    def one(i):
        out[i] = gen.generate(prompts[i], sampling, seeds[i])
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_greedy_batched_equals_generate_one_by_one(model):
    prompts = _prompts(6)
    ref = LocalGenerator(model, eos_token_id=-1)
    gen = BatchedGenerator(model, eos_token_id=-1)
    try:
        got = _concurrently(gen, prompts, GREEDY, list(range(6)))
    finally:
        gen.close()
    for p, g in zip(prompts, got):
        assert g.token_ids == ref.generate(p, GREEDY, 0).token_ids
        assert g.finish_reason == "length" and len(g.token_ids) == 12
        exact = recompute_logprobs(model, p + g.token_ids, len(p))
        assert max(abs(a - b) for a, b in zip(g.logprobs, exact)) < 1e-4
    assert gen.stats["reused_tokens"] >= 5 * 40 - 5        # the shared prefix was computed once (or nearly)


def test_sampled_tokens_depend_on_the_seed_not_on_the_batch(model):
    prompts, seeds = _prompts(8), [11, 12, 13, 14, 15, 16, 17, 18]
    sampling = Sampling(temperature=1.0, top_k=20, top_p=0.95, max_tokens=10)
    gen = BatchedGenerator(model, eos_token_id=-1)
    try:
        together = _concurrently(gen, prompts, sampling, seeds)
        gen.load_weights(model, "base")                               # drop caches: no reuse in the rerun
        alone = [gen.generate(p, sampling, s) for p, s in zip(prompts, seeds)]
    finally:
        gen.close()
    assert [g.token_ids for g in together] == [g.token_ids for g in alone]
    assert len({tuple(g.token_ids) for g in together}) > 1


def test_a_continued_conversation_reuses_its_cache(model):
    p = _prompts(1)[0]
    gen, fresh = BatchedGenerator(model, eos_token_id=-1), BatchedGenerator(model, eos_token_id=-1)
    try:
        first = gen.generate(p, GREEDY, 0)
        turn2 = p + first.token_ids + [7, 8, 9, 10]                # observation appended, as a TokenTrace does
        before = dict(gen.stats)
        second = gen.generate(turn2, GREEDY, 1)
        assert gen.stats["prefill_tokens"] - before["prefill_tokens"] == 5   # last generated token + 4 new
        assert second.token_ids == fresh.generate(turn2, GREEDY, 1).token_ids
    finally:
        gen.close()
        fresh.close()


def test_idle_caches_stay_within_the_byte_budget_and_running_ones_are_kept(model):
    """Idle conversations are dropped least recently used first once the caches pass the budget;
    the sequences running together all keep theirs (over budget if they must), with the same tokens."""
    from tbhpc.policy.batched import _slot_bytes
    prompts, seeds = _prompts(6), list(range(6))
    sampling = Sampling(temperature=1.0, max_tokens=10)
    roomy = BatchedGenerator(model, eos_token_id=-1)
    tight = BatchedGenerator(model, eos_token_id=-1, cache_bytes=1)
    try:
        together = _concurrently(tight, prompts, sampling, seeds)
        assert [g.token_ids for g in together] == [g.token_ids for g in _concurrently(roomy, prompts, sampling, seeds)]
        one = _slot_bytes(roomy.slots[0])
        for p, s in zip(prompts, seeds):                               # one at a time: only the newest is kept
            tight.generate(p, sampling, s)
            assert len(tight.slots) == 1
        budgeted = BatchedGenerator(model, eos_token_id=-1, cache_bytes=3 * one)
        try:
            for p, s in zip(prompts, seeds):
                budgeted.generate(p, sampling, s)
            assert len(budgeted.slots) == 3 and sum(map(_slot_bytes, budgeted.slots)) <= 3 * one
        finally:
            budgeted.close()
        assert len(roomy.slots) == 6
    finally:
        roomy.close()
        tight.close()


def test_errors_reach_the_caller_and_the_generator_keeps_serving(model):
    gen = BatchedGenerator(model, eos_token_id=-1)
    good = []
    try:
        other = threading.Thread(target=lambda: good.append(gen.generate(_prompts(1)[0], Sampling(max_tokens=40), 0)))
        other.start()                                                 # in flight while the bad request fails
        with pytest.raises(IndexError):
            gen.generate([10, 10 ** 7], GREEDY, 0)                   # token id outside the vocabulary
        other.join()
        assert len(good[0].token_ids) == 40 and all(not s.busy for s in gen.slots)
        assert len(gen.generate(_prompts(1)[0], GREEDY, 0).token_ids) == 12
    finally:
        gen.close()


def test_new_weights_change_the_version_and_drop_the_caches(model, tiny_dir_b):
    gen = BatchedGenerator(model, eos_token_id=-1)
    p = _prompts(1)[0]
    try:
        a = gen.generate(p, GREEDY, 0)
        other = AutoModelForCausalLM.from_pretrained(tiny_dir_b, dtype=torch.float32).eval()
        gen.load_weights(other, "step-000001")
        assert gen.slots == []
        b = gen.generate(p, GREEDY, 0)
        assert a.version == "base" and b.version == "step-000001"
        assert b.token_ids == LocalGenerator(other, eos_token_id=-1).generate(p, GREEDY, 0).token_ids
    finally:
        gen.close()


def test_sample_batch_follows_top_k_and_the_distribution():
    logits = torch.randn(1, 50, generator=torch.Generator().manual_seed(0)) * 2
    rng = random.Random(0)
    counts = torch.zeros(50)
    for _ in range(4000):
        counts[sample_batch(logits, Sampling(top_k=0, top_p=1.0), [rng.random()])[0][0]] += 1
    assert float((counts / 4000 - torch.softmax(logits[0], -1)).abs().max()) < 0.03
    seen = {sample_batch(logits, Sampling(top_k=5, top_p=1.0), [rng.random()])[0][0] for _ in range(500)}
    assert seen == set(torch.topk(logits[0], 5).indices.tolist())
    toks, lps = sample_batch(logits.repeat(3, 1), Sampling(top_k=20, top_p=0.5), [0.0, 0.5, 0.999])
    raw = torch.log_softmax(logits[0], -1)
    assert lps == pytest.approx([float(raw[t]) for t in toks])
    assert toks[0] == int(torch.argmax(logits))
