"""The episode loop: finish reasons, system errors, simulated users and judges."""
import dataclasses
import json

import pytest

from tbhpc.domains import get_domain
from tbhpc.env.episode import EpisodeConfig, run_episode
from tbhpc.env.judge import KeywordJudge, LLMJudge, parse_yes
from tbhpc.env.users import LLMUser, ScriptedUser, parse_facts
from tbhpc.llm_client import ChatEndpoint
from tbhpc.env.agent import Completion
from tbhpc.policy.openai import OpenAIPolicy
from tbhpc.policy.scripted import OraclePolicy


class Script:
    """A policy that says the given lines in order (then repeats the last)."""

    name = "script"

    def __init__(self, *lines):
        self.lines = list(lines)

    def session(self, task, seed=0):
        lines = list(self.lines)

        class S:
            def complete(self, messages, tools):
                return Completion(lines.pop(0) if len(lines) > 1 else lines[0])
        return S()


def _run(task, policy, user=None, judge=None, **cfg):
    return run_episode(task, get_domain(task.domain), policy, user or ScriptedUser(), judge or KeywordJudge(), EpisodeConfig(**cfg))


def test_user_limit_is_graded(tasks_by_id):
    t = tasks_by_id["retail-order_status-000"]
    r = _run(t, Script("Could you tell me more?"))
    assert r.finish_reason == "user_limit" and r.status == "ok" and r.reward == 0.0
    assert r.user_turns == t.max_user_turns and r.agent_turns == t.max_user_turns + 1


def test_agent_limit(tasks_by_id):
    t = tasks_by_id["retail-order_status-000"]
    r = _run(t, Script('<tool_call>{"name": "search_policy", "arguments": {"query": "status"}}</tool_call>'), max_agent_turns=5)
    assert r.finish_reason == "agent_limit" and r.agent_turns == 5 and r.tool_calls == 5 and r.reward == 0.0


def test_end_turn_tool_finishes_the_episode(tasks_by_id):
    t = tasks_by_id["retail-order_status-000"]
    cust = t.data_patch["customers"][0]["id"]
    call = {"name": "transfer_to_human", "arguments": {"customer_id": cust, "reason": "legal", "summary": "asked for a lawyer"}}
    r = _run(t, Script(f"<tool_call>{json.dumps(call)}</tool_call>", "never said"))
    assert r.finish_reason == "end_turn_tool" and r.agent_turns == 1 and r.reward == 0.0
    assert any("handoffs" in line for line in r.grade["diff"])


def test_unparseable_and_unknown_calls_are_shown_to_the_model(tasks_by_id):
    t = tasks_by_id["retail-order_status-000"]
    r = _run(t, Script('<tool_call>{"name": "get_order", "arguments": {oops}}</tool_call>',
                       '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>', "Sorry. <DONE>"))
    tool_msgs = [json.loads(m["content"]) for m in r.messages if m["role"] == "tool"]
    assert "could not parse" in tool_msgs[0]["error"] and "unknown tool" in tool_msgs[1]["error"]
    assert r.tool_errors == 2 and r.finish_reason == "done"


def test_done_marker_only_counts_at_the_end(tasks_by_id):
    t = tasks_by_id["retail-order_status-000"]
    r = _run(t, Script("I will say <DONE> later, what is your email?", "Bye <DONE>"))
    assert r.finish_reason == "done" and r.user_turns == 1


def test_scripted_user_answers_from_facts():
    facts = parse_facts("You are X.\nFacts you know:\n- email: a@b.c\n- order id: O7\n- new address: 1 Elm St\nRules: ...")
    assert facts == [("email", "a@b.c"), ("order id", "O7"), ("new address", "1 Elm St")]
    from tbhpc.tasks.schema import Task
    task = Task("t", "retail", "q", "- email: a@b.c\n- order id: O7", {}, (), "train")
    s = ScriptedUser().session(task)
    reply = lambda text: s.reply([{"role": "assistant", "content": text}])[0]
    assert reply("What is your email and the order number?") == "My email is a@b.c. My order id is O7."
    assert reply("Shall I proceed with the cancellation?") == "Yes, please go ahead."
    assert reply("What is your mother's maiden name?") == "I don't know."


def test_openai_policy_endpoint_failure_is_a_system_error(tasks_by_id, stub_llm):
    server = stub_llm(lambda body: (503, {"error": "overloaded"}))
    t = tasks_by_id["retail-order_status-000"]
    r = _run(t, OpenAIPolicy(base_url=server.url, model="m", retries=2, timeout_s=5, backoff_s=0.01))
    assert r.status == "system_error" and r.reward is None and r.error_kind == "endpoint"
    assert len(server.requests) == 3  # first try + 2 retries
    server4 = stub_llm(lambda body: (400, {"error": "bad request"}))
    r = _run(t, OpenAIPolicy(base_url=server4.url, model="m", retries=2, timeout_s=5, backoff_s=0.01))
    assert r.status == "system_error" and "HTTP 400" in r.error and len(server4.requests) == 1


def test_openai_policy_structured_tool_calls_go_through_the_interpreter(tasks_by_id, stub_llm):
    t = tasks_by_id["retail-order_status-000"]
    calls = list(t.golden_calls)

    def respond(body):
        assert body["temperature"] == 1.0 and body["top_k"] == 20 and body["top_p"] == 0.95 and body["tools"]
        n_tools = sum(1 for m in body["messages"] if m["role"] == "tool")
        if n_tools < len(calls):
            c = calls[n_tools]
            args = {k: str(v) for k, v in c.parameters.items()}  # stringly-typed, as small models do
            msg = {"role": "assistant", "content": None, "reasoning_content": "thinking",
                   "tool_calls": [{"id": "x", "type": "function", "function": {"name": c.tool, "arguments": json.dumps(args)}}]}
        else:
            msg = {"role": "assistant", "content": t.golden_response + " <DONE>"}
        return 200, {"choices": [{"message": msg}], "usage": {"prompt_tokens": 100, "completion_tokens": 7,
                                                              "prompt_tokens_details": {"cached_tokens": 64}}}

    server = stub_llm(respond)
    r = _run(t, OpenAIPolicy(base_url=server.url, model="m"))
    assert r.passed and r.finish_reason == "done"
    assert r.usage["agent"] == {"input_tokens": 100 * (len(calls) + 1), "cached_tokens": 64 * (len(calls) + 1),
                                "output_tokens": 7 * (len(calls) + 1), "reasoning_tokens": 0}
    assert all("reasoning" not in m for m in server.requests[-1]["messages"])  # bookkeeping keys stay local


def test_llm_user_gets_context_and_transcript_without_reasoning(tasks_by_id, stub_llm):
    t = tasks_by_id["retail-order_status-000"]
    server = stub_llm(lambda body: (200, "My email is in my notes."))
    user = LLMUser(ChatEndpoint(server.url, "user-model"))
    r = _run(t, Script("<think>secret plan</think>What is your email?", "Thanks <DONE>"), user=user)
    assert r.user_turns == 1 and r.messages[-2] == {"role": "user", "content": "My email is in my notes."}
    body = server.requests[0]
    assert body["temperature"] == 0.3 and body["model"] == "user-model"
    prompt = body["messages"][1]["content"]
    assert t.user_context in prompt and "What is your email?" in prompt and "secret plan" not in prompt
    assert "Never reveal USER_CONTEXT" in body["messages"][0]["content"]


def test_llm_user_failure_is_a_system_error(tasks_by_id, stub_llm):
    server = stub_llm(lambda body: (500, {"error": "boom"}))
    user = LLMUser(ChatEndpoint(server.url, "u", retries=1, backoff_s=0.01))
    r = _run(tasks_by_id["retail-order_status-000"], Script("Hello?"), user=user)
    assert r.status == "system_error" and r.error_kind == "endpoint"


@pytest.mark.parametrize("answer,expected", [("Yes", True), ("yes.", True), ("No", False), ("The answer is yes", True),
                                             ("No, it does not say yes or no", False), ("", False)])
def test_parse_yes(answer, expected):
    assert parse_yes(answer) is expected


def test_llm_judge_decides_rubric_tasks(pack_tasks, stub_llm):
    t = next(t for t in pack_tasks if t.rubrics_yesno)
    seen = []

    def respond(body):
        seen.append(body)
        return 200, "Yes" if "&lt;DONE&gt;" in body["messages"][1]["content"] else "No"

    server = stub_llm(respond)
    r = _run(t, OraclePolicy(), judge=LLMJudge(ChatEndpoint(server.url, "judge")))
    assert r.passed and r.grade["rubrics"][0]["yes"] and seen[0]["temperature"] == 0
    assert "<message>" in seen[0]["messages"][1]["content"] and r.usage["judge"]["input_tokens"] == 11
    server_no = stub_llm(lambda body: (200, "No"))
    r = _run(t, OraclePolicy(), judge=LLMJudge(ChatEndpoint(server_no.url, "judge")))
    assert r.status == "ok" and r.reward == 0.0 and r.grade["state_match"]


def test_keyword_judge_without_keywords_is_a_system_error(tasks_by_id):
    import dataclasses
    from tbhpc.tasks.schema import Rubric
    t = dataclasses.replace(tasks_by_id["retail-order_status-000"], rubrics_yesno=(Rubric("Was it polite?"),))
    r = _run(t, OraclePolicy())
    assert r.status == "system_error" and "keyword judge" in r.error


def test_judge_endpoint_failure_is_a_system_error(pack_tasks, stub_llm):
    t = next(t for t in pack_tasks if t.rubrics_yesno)
    server = stub_llm(lambda body: (502, {"error": "bad gateway"}))
    r = _run(t, OraclePolicy(), judge=LLMJudge(ChatEndpoint(server.url, "judge", retries=1, backoff_s=0.01)))
    assert r.status == "system_error" and r.reward is None and r.error_kind == "endpoint" and len(server.requests) == 2


def test_openai_policy_response_budget_and_endpoint_file(tasks_by_id, stub_llm, tmp_path):
    from tbhpc.campaign.config import CampaignConfig
    from tbhpc.serve.endpoint import Endpoint, write_endpoint
    server = stub_llm(lambda body: (200, {"choices": [{"message": {"role": "assistant", "content": "What is your email?"}}],
                                          "usage": {"prompt_tokens": 50, "completion_tokens": body["max_tokens"]}}))
    port = int(server.url.split(":")[-1].split("/")[0])
    write_endpoint(tmp_path, Endpoint("127.0.0.1", port, "policy", "step-000012"))
    t = dataclasses.replace(tasks_by_id["retail-order_status-000"], max_user_turns=10)
    r = _run(t, OpenAIPolicy(endpoint=str(tmp_path), response_budget=25, sampling={"max_tokens": 10}))
    assert r.finish_reason == "response_budget" and r.status == "ok" and r.reward == 0.0
    assert [b["max_tokens"] for b in server.requests] == [10, 10, 5] and all(b["model"] == "policy" for b in server.requests)
    cfg = CampaignConfig(policy="openai", policy_opts={"endpoint": str(tmp_path)})
    assert cfg.resolved_policy_id.startswith("openai:policy@step-000012:")   # results name the served weights
