"""The `hf` policy through the real transformers loading path, on tiny models built here.

The models have random weights (no hub is reachable): the test proves loading, chat-template
rendering with tools, generation, decoding and interpretation inside a real episode, not skill.
"""
import dataclasses

import pytest

from tbhpc.domains import get_domain
from tbhpc.env.episode import run_episode
from tbhpc.env.users import ScriptedUser
from tbhpc.policy import make_policy
from tbhpc.policy.tiny import build_tiny_model

pytestmark = pytest.mark.slow


def test_hf_policy_runs_a_graded_episode(tiny_dir, tasks_by_id):
    task = dataclasses.replace(tasks_by_id["retail-order_status-000"], max_user_turns=2)
    policy = make_policy("hf", model_path=str(tiny_dir), max_new_tokens=12, seed=3)
    r1 = run_episode(task, get_domain("retail"), policy, ScriptedUser())
    assert r1.status == "ok" and r1.reward == 0.0, r1.error
    assert r1.finish_reason in ("user_limit", "done", "end_turn_tool")
    assert r1.usage["agent"]["input_tokens"] > 500 and 0 < r1.usage["agent"]["output_tokens"] <= 12 * r1.agent_turns
    r2 = run_episode(task, get_domain("retail"), policy, ScriptedUser())
    assert [m.get("content") for m in r2.messages] == [m.get("content") for m in r1.messages]  # seeded sampling


def test_llama_architecture_loads_the_same_way(tmp_path, tasks_by_id):
    path = build_tiny_model(tmp_path / "tiny-llama", arch="llama", vocab_size=1000)
    task = dataclasses.replace(tasks_by_id["neobank-balance_lookup-000"], max_user_turns=0)
    r = run_episode(task, get_domain("neobank"), make_policy("hf", model_path=str(path), max_new_tokens=4), ScriptedUser())
    assert r.status == "ok" and r.agent_turns >= 1


def test_missing_model_path_is_a_clear_error(tasks_by_id):
    from tbhpc.errors import UserError
    with pytest.raises(UserError, match="model_path"):
        make_policy("hf", model_path="/nonexistent/model").session(tasks_by_id["retail-order_status-000"])
