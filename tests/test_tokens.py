"""Token-exact rollouts without a server: the colocated generator (transformers in process) on a
tiny model, the chat-template prefix check, budgets, and episodes -> HDF5 rows.

The models have random weights: these tests prove bookkeeping (ids as generated, masks, logprobs,
observation deltas), not skill. A scripted generator (`FixedGenerator`) stands in where a test
needs chosen output ids; it is a fake of the model only, everything else is real.
"""
import dataclasses

import numpy as np
import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from tbhpc.domains import get_domain
from tbhpc.env.episode import run_episode
from tbhpc.env.users import ScriptedUser
from tbhpc.policy import make_policy
from tbhpc.policy.generation import Generation, recompute_logprobs
from tbhpc.policy.tiny import CHAT_TEMPLATE
from tbhpc.rollout.buffer import read_episode, write_step
from tbhpc.rollout.collect import collect_group
from tbhpc.rollout.tokens import TemplatePrefixError

pytestmark = pytest.mark.slow


def _task(tasks_by_id, tid="retail-order_status-000", user_turns=2):
    return dataclasses.replace(tasks_by_id[tid], max_user_turns=user_turns)


def test_local_generation_is_token_exact(tiny_dir, tasks_by_id):
    task = _task(tasks_by_id)
    policy = make_policy("tokens", generator="local", model_path=str(tiny_dir), max_tokens=16, seed=1)
    res = run_episode(task, get_domain("retail"), policy, ScriptedUser(), seed=5)
    tr = policy.pop_trace(task.id, 5)
    assert res.status == "ok", res.error
    assert res.agent_turns >= 2 and res.user_turns >= 1
    mask = np.array(tr.loss_mask, bool)
    assert mask.sum() == tr.generated == res.usage["agent"]["output_tokens"]
    assert len(tr.tokens) == len(tr.loss_mask) == len(tr.logprobs)
    assert not np.any(np.array(tr.logprobs)[~mask])            # logprobs only where the policy sampled
    tr.verify(res.messages)                                      # re-rendering reproduces the stored stream
    # behaviour logprobs equal an in-process recomputation over the stored ids
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    lp = np.array(recompute_logprobs(model, tr.tokens, 1))
    np.testing.assert_allclose(lp[mask[1:]], np.array(tr.logprobs[1:])[mask[1:]], atol=1e-4)
    # the prompt of turn 1 is exactly the chat template's rendering of the first two messages
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    first = tok.apply_chat_template(res.messages[:2], tools=tr.tools, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert tr.tokens[:len(first)] == list(first)


def test_response_budget_ends_the_episode(tiny_dir, tasks_by_id):
    task = _task(tasks_by_id, user_turns=5)
    policy = make_policy("tokens", generator="local", model_path=str(tiny_dir), max_tokens=16, response_budget=40)
    res = run_episode(task, get_domain("retail"), policy, ScriptedUser(), seed=2)
    tr = policy.pop_trace(task.id, 2)
    assert res.status == "ok" and res.finish_reason == "response_budget" and res.reward == 0.0
    assert tr.generated == 40 and sum(tr.loss_mask) == 40
    tr.verify(res.messages)


class FixedGenerator:
    """Returns chosen token ids (a stand-in for the model), one list per turn."""

    def __init__(self, turns, eos):
        self.turns, self.eos = list(turns), eos

    def generate(self, prompt_ids, sampling, seed):
        ids = self.turns.pop(0) + [self.eos]
        return Generation(ids, [-0.5] * len(ids), "stop", "step-000003")


# Like Qwen3's published template: earlier assistant turns lose their <think> block.
DROPS_REASONING = CHAT_TEMPLATE.replace("{{ m.content or '' }}", "{{ (m.content or '').split('</think>')[-1] if not loop.last else (m.content or '') }}")


@pytest.mark.parametrize("template,breaks", [(CHAT_TEMPLATE, False), (DROPS_REASONING, True)])
def test_prefix_property_is_checked(tiny_dir, tasks_by_id, template, breaks):
    task = _task(tasks_by_id, user_turns=1)
    policy = make_policy("tokens", generator="local", model_path=str(tiny_dir), on_template_break="error")
    tok, _ = policy.load()
    tok.chat_template = template
    say = "<think>I should look the order up first.</think>Could you give me your order number?"
    policy.use(tok, FixedGenerator([tok.encode(say), tok.encode("<think>done</think>Thanks!")], tok.eos_token_id))
    res = run_episode(task, get_domain("retail"), policy, ScriptedUser(), seed=0)
    tr = policy.pop_trace(task.id, 0)
    assert res.agent_turns == 2 and tr.turn_versions == ["step-000003"] * 2
    if breaks:
        with pytest.raises(TemplatePrefixError, match="not prefix-stable"):
            tr.verify(res.messages)
    else:
        tr.verify(res.messages)
        assert tok.decode(tr.tokens).count("<think>") == 2


def test_a_template_that_drops_reasoning_splits_the_episode_into_samples(tiny_dir, tasks_by_id):
    """Qwen3-style: once the user speaks again, the first turn's <think> block is gone from the
    template's rendering. The episode becomes two samples: the first as generated, the second
    starting from the template's own rendering (what a chat endpoint shows the model)."""
    task = _task(tasks_by_id, user_turns=1)
    policy = make_policy("tokens", generator="local", model_path=str(tiny_dir))
    tok, _ = policy.load()
    tok.chat_template = DROPS_REASONING
    first = tok.encode("<think>I should look the order up first.</think>Could you give me your order number?")
    policy.use(tok, FixedGenerator([first, tok.encode("<think>done</think>Thanks!")], tok.eos_token_id))
    res = run_episode(task, get_domain("retail"), policy, ScriptedUser(), seed=0)
    tr = policy.pop_trace(task.id, 0)
    tr.verify(res.messages)                                   # the last sample is prefix-stable
    (t1, m1, _, _), (t2, m2, lp2, _) = tr.samples()
    assert tok.decode([t for t, m in zip(t1, m1) if m]) == tok.decode(first + [tok.eos_token_id])
    second = tok.decode(t2)
    assert "I should look the order up first." not in second and second.count("<think>") == 1   # dropped, as the template does
    assert tok.decode([t for t, m in zip(t2, m2) if m]).startswith("<think>done</think>Thanks!")
    assert all(lp == 0.0 for lp, m in zip(lp2, m2) if not m)
    policy.use(tok, FixedGenerator([first, tok.encode("<think>done</think>Thanks!")], tok.eos_token_id))
    rolled = collect_group(task, get_domain("retail"), policy, ScriptedUser(), None, group=0, n=1)
    assert len(rolled[0].samples) == 2 and {s.reward for s in rolled[0].samples} == {rolled[0].episode.reward}


def test_collect_group_to_hdf5(tiny_dir, tasks_by_id, tmp_path):
    task = _task(tasks_by_id, user_turns=1)
    policy = make_policy("tokens", generator="local", model_path=str(tiny_dir), max_tokens=8)
    rolls = collect_group(task, get_domain("retail"), policy, ScriptedUser(), None, group=7, n=3)
    assert [r.episode.attempt_key for r in rolls] == [f"{task.id}#{i}" for i in range(3)]
    path = write_step(tmp_path, 0, [r.episode for r in rolls])
    back = read_episode(path, 2)
    assert back.tokens.tolist() == rolls[2].episode.tokens.tolist() and back.group == 7
    assert back.finish_reason == rolls[2].result.finish_reason and back.policy_version == 0
    assert len({tuple(r.episode.tokens.tolist()) for r in rolls}) == 3   # seeds differ per attempt


def test_samples_from_unverified_weights_are_never_training_rows(tiny_dir, tasks_by_id):
    """Tokens tagged with a version the server did not verify (during a sync's check, or after a
    refused one) raise instead of becoming buffer rows; a verified step is kept with its number."""
    from tbhpc.rollout.collect import UntrustedWeights
    task = _task(tasks_by_id, user_turns=1)
    policy = make_policy("tokens", generator="local", model_path=str(tiny_dir), max_tokens=8)
    gen = policy.load()[1]
    gen.version = "step-000004"
    assert {r.episode.policy_version for r in collect_group(task, get_domain("retail"), policy, ScriptedUser(), None,
                                                            group=0, n=2)} == {4}
    for bad in ("rejected:step-000005", "unverified:step-000005"):
        gen.version = bad
        with pytest.raises(UntrustedWeights, match=f"did not verify \\({bad}\\)"):
            collect_group(task, get_domain("retail"), policy, ScriptedUser(), None, group=0, n=1)
