"""Chunked logprobs (tbhpc/train/logprobs.py) against the [T, V] computation they replace: the same
values, entropies and gradients (1e-5 in fp32), exact derivatives (gradcheck in fp64), and the
same numbers through a real HF model, its head swapped in place."""
import numpy as np
import pytest
import torch

from tbhpc.errors import UserError
from tbhpc.rollout.buffer import Episode
from tbhpc.train.logprobs import LogprobHead, chunked_logprobs, full_logprobs, install, token_logprobs
from tbhpc.train.packing import pack

pytestmark = pytest.mark.kernels


def _reference(h, w, t):
    lp = torch.log_softmax((h @ w.T).float(), -1)
    return lp.gather(1, t[:, None]).squeeze(1), -(lp.exp() * lp).sum(-1)


@pytest.mark.parametrize("chunk", [1, 7, 64, 1000])
def test_chunked_values_and_gradients_equal_the_full_logits_route(chunk):
    torch.manual_seed(0)
    n, hid, vocab = 61, 24, 97
    h = torch.randn(n, hid, requires_grad=True)
    w = (torch.randn(vocab, hid) * 0.3).requires_grad_(True)
    t = torch.randint(0, vocab, (n,))
    g_lp, g_ent = torch.randn(n), torch.randn(n)

    out = chunked_logprobs(h, w, t, chunk=chunk, entropy=True)
    (out[:, 0] * g_lp + out[:, 1] * g_ent).sum().backward()
    got = out.detach(), h.grad.clone(), w.grad.clone()
    h.grad = w.grad = None
    lp, ent = _reference(h, w, t)
    (lp * g_lp + ent * g_ent).sum().backward()
    assert torch.allclose(got[0][:, 0], lp.detach(), atol=1e-5)
    assert torch.allclose(got[0][:, 1], ent.detach(), atol=1e-5)
    assert torch.allclose(got[1], h.grad, atol=1e-5)
    assert torch.allclose(got[2], w.grad, atol=1e-5)


def test_bf16_logits_are_computed_in_fp32_not_rounded_to_bf16_first():
    """A bf16 run's head: its logits must be the fp32 product of the bf16 values (a bf16 GEMM output
    rounds each logit to 8 bits of mantissa first: ~0.01 nats of noise in every logprob)."""
    torch.manual_seed(2)
    n, hid, vocab = 64, 256, 4096
    h = torch.randn(n, hid).to(torch.bfloat16)
    w = (torch.randn(vocab, hid) * 0.25).to(torch.bfloat16)          # logits of std ~4, as a trained head's
    t = torch.randint(0, vocab, (n,))
    got = chunked_logprobs(h, w, t, chunk=16, entropy=True)
    lp, ent = _reference(h.double(), w.double(), t)                  # the same bf16 values, exactly
    rounded, _ = _reference(h, w, t)                                 # what a bf16 logit GEMM gives
    assert (got[:, 0].double() - lp).abs().max() < 1e-5 and (got[:, 1].double() - ent).abs().max() < 1e-3
    assert (rounded.double() - lp).abs().max() > 1e-3                # the rounding this avoids is real here


def test_chunked_backward_is_the_exact_derivative():
    torch.manual_seed(1)
    h = torch.randn(13, 6, dtype=torch.float64, requires_grad=True)
    w = torch.randn(11, 6, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, 11, (13,))
    assert torch.autograd.gradcheck(lambda a, b: chunked_logprobs(a, b, t, chunk=4, entropy=True), (h, w))
    assert torch.autograd.gradcheck(lambda a, b: chunked_logprobs(a, b, t, chunk=5, entropy=False)[:, 0], (h, w))


def _episodes(vocab, lengths, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for n in lengths:
        mask = (rng.random(n) < 0.6).astype(np.uint8)
        out.append(Episode(rng.integers(0, vocab, n), mask, np.zeros(n), 0, 0.0))
    return out


def test_through_a_model_the_head_swap_gives_the_full_routes_logprobs_and_gradients(tiny_dir):
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    eps = _episodes(model.config.vocab_size, (40, 17, 90))
    mb = pack(eps, [0.5, -1.0, 0.25], budget=200)[0]
    ref = full_logprobs(model, mb)
    (ref * mb.loss_mask).sum().backward()
    ref_grads = {k: p.grad.clone() for k, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    lp, ent = token_logprobs(model, mb, chunk=32, entropy=True)
    (lp * mb.loss_mask).sum().backward()
    assert isinstance(model.lm_head, LogprobHead) and lp.shape == ref.shape
    assert torch.allclose(lp, ref.detach(), atol=1e-5)
    ent = ent.detach()
    assert bool((ent > 0).all()) and float(ent.max()) <= np.log(model.config.vocab_size) + 1e-4
    worst = max((p.grad - ref_grads[k]).abs().max().item() / max(ref_grads[k].abs().max().item(), 1e-12)
                for k, p in model.named_parameters())
    assert worst < 1e-4, worst
    # with no targets set, the head is the plain Linear (generation, fingerprints)
    ids = mb.input_ids[:, :10]
    assert model(input_ids=ids).logits.shape == (1, 10, model.config.vocab_size)


def test_heads_it_cannot_chunk_are_refused_in_one_line(tiny_dir):
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    model.config.final_logit_softcapping = 30.0
    with pytest.raises(UserError, match="final_logit_softcapping"):
        install(model)
    model.config.final_logit_softcapping = None
    model.lm_head = torch.nn.Linear(model.config.hidden_size, model.config.vocab_size, bias=True)
    with pytest.raises(UserError, match="with a bias"):
        install(model)
