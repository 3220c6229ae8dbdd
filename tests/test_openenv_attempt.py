"""The attempt an OpenEnv session holds (tbhpc.openenv.attempt), without OpenEnv: it must grade
exactly as the in-process episode does, keep sessions apart, and latch a system error."""
from __future__ import annotations

import json

import pytest

from tbhpc.domains import get_domain
from tbhpc.env.episode import run_episode
from tbhpc.env.users import ScriptedUser
from tbhpc.errors import BackendError
from tbhpc.openenv.attempt import FINISH, SUBMIT, Attempt
from tbhpc.policy.scripted import NoopPolicy, OraclePolicy


def _open(task):
    return Attempt.open(task, get_domain(task.domain), ScriptedUser(), None)


def _oracle_through(attempt: Attempt, task) -> None:
    for call in task.golden_calls:
        out = attempt.call(call.tool, dict(call.parameters))
        assert set(out) == {"output", "ok", "end_turn"}


def test_the_oracle_passes_and_noop_fails_with_the_in_process_hashes(pack_tasks):
    for task in [t for t in pack_tasks if t.golden_calls][:12]:
        local_pass = run_episode(task, get_domain(task.domain), OraclePolicy(), ScriptedUser())
        local_noop = run_episode(task, get_domain(task.domain), NoopPolicy(), ScriptedUser())
        a = _open(task)
        first = a.first()
        assert first["task_id"] == task.id and first["message"] == task.query
        assert first["system_prompt"] == local_pass.messages[0]["content"]
        names = [t["name"] for t in a.tools()]
        assert names[-1] == SUBMIT and FINISH not in names
        assert names[:-1] == [s["function"]["name"] for s in local_pass.tools]
        _oracle_through(a, task)
        v = a.finish(local_pass.final_message, "done")
        assert (v.verdict, v.reward) == ("pass", 1.0) == ("pass", local_pass.reward)
        assert v.grade["final_hash"] == local_pass.grade["final_hash"] == local_pass.grade["golden_hash"]
        assert a.finish() is v, "finish grades once"
        a.close()
        b = _open(task)
        w = b.finish(local_noop.final_message, "done")
        assert (w.verdict, w.reward, w.grade["final_hash"]) == ("fail", 0.0, local_noop.grade["final_hash"])
        b.close()


def test_two_attempts_on_one_task_never_see_each_other(pack_tasks):
    task = next(t for t in pack_tasks if t.golden_calls and any(get_domain(t.domain).tools[c.tool].mutates
                                                                 for c in t.golden_calls))
    a, b = _open(task), _open(task)
    _oracle_through(a, task)
    assert b.session.check_state().final_hash != a.session.check_state().final_hash
    _oracle_through(b, task)       # the same rows again, in b's own copy: the same result as a's
    assert b.session.check_state().final_hash == a.session.check_state().final_hash
    assert a.finish(task.golden_response, "done").verdict == "pass" and b.finish(task.golden_response, "done").verdict == "pass"


def test_submit_message_gets_the_scripted_users_reply_and_the_cap_ends_it(pack_tasks):
    task = next(t for t in pack_tasks if "- " in t.user_context)
    a = _open(task)
    key, value = next(line[2:].split(": ", 1) for line in task.user_context.splitlines() if line.startswith("- "))
    expected, _ = ScriptedUser().session(task).reply([{"role": "assistant", "content": f"What is your {key}?"}])
    assert a.submit(f"What is your {key}?") == expected
    for _ in range(task.max_user_turns - 1):
        assert a.submit("Anything else?") is not None
    assert a.submit("Last one?") is None and a.done
    assert a.verdict.finish_reason == "user_limit" and a.verdict.verdict in ("pass", "fail")


def test_a_backend_failure_latches_a_system_error_never_a_zero(pack_tasks, monkeypatch):
    task = next(t for t in pack_tasks if t.golden_calls)
    a = _open(task)

    def broken(name, arguments):
        raise BackendError("the backend went away")

    monkeypatch.setattr(a.session, "call", broken)
    out = a.call(task.golden_calls[0].tool, {})
    assert out["ok"] is False and a.done
    v = a.finish("done <DONE>", "done")
    assert (v.verdict, v.reward, v.error_kind) == ("system_error", None, "backend")
    assert "tool_call" in v.error and "went away" in v.error
    record = a.record()
    assert record["status"] == "done" and record["verdict"]["verdict"] == "system_error"
    json.dumps(record)    # the record is JSON (OpenEnv sends it as `state`)


@pytest.mark.parametrize("final", [None, "All set. <DONE>"])
def test_the_final_message_is_graded_whether_submitted_or_given_at_finish(pack_tasks, final):
    task = next(t for t in pack_tasks if t.output_contains)
    a = _open(task)
    _oracle_through(a, task)
    if final is None:
        a.messages.append({"role": "assistant", "content": task.golden_response})
    v = a.finish(final, "done")
    assert v.grade["state_match"] is True
    assert (v.verdict == "pass") == (final is None), v.grade["output_missing"]
