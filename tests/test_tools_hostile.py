"""Hostile tool arguments produce tool errors, never crashes or writes outside the episode's
own backend; concurrent episodes of one task are isolated; infra failures are system errors."""
import json
import threading

import pytest

from tbhpc.domains import get_domain
from tbhpc.env.episode import run_episode
from tbhpc.env.judge import KeywordJudge
from tbhpc.env.state import canonical_state, state_hash
from tbhpc.env.tools import ToolRegistry, P
from tbhpc.env.users import ScriptedUser
from tbhpc.errors import BackendError
from tbhpc.env.agent import Completion
from tbhpc.policy.scripted import OraclePolicy

TASK = "retail-change_of_mind_return-000"


@pytest.fixture
def retail_box(tasks_by_id):
    task = tasks_by_id[TASK]
    domain = get_domain("retail")
    backend = domain.backend(task)
    yield domain, task, backend, domain.toolbox(backend)
    backend.conn.close()


HOSTILE = [
    ("get_order", {"order_id": "O1' OR '1'='1"}),
    ("get_order", {"order_id": "O1; DROP TABLE orders; --"}),
    ("find_customer_by_email", {"email": "x' UNION SELECT * FROM customers --"}),
    ("search_policy", {"query": "***"}),
    ("get_order", {"order_id": "O" * 1_000_000}),
    ("get_order", {"order_id": 12345}),
    ("get_order", {"order_id": None}),
    ("get_order", {}),
    ("get_order", {"order_id": "O1", "admin": True}),
    ("create_return", {"order_id": "O1", "product_id": "P1", "quantity": -5, "reason": "defective", "resolution": "refund"}),
    ("create_return", {"order_id": "O1", "product_id": "P1", "quantity": 1, "reason": "because", "resolution": "refund"}),
    ("issue_refund", {"order_id": "O1", "amount": "1e9", "method": "original_payment"}),
    ("issue_refund", {"order_id": "O1", "amount": True, "method": "original_payment"}),
    ("drop_database", {}),
    ("__reserved__init", {"config": {}}),
    ("get_order", ["O1"]),
    ("get_order", "O1"),
]


@pytest.mark.parametrize("tool,args", HOSTILE)
def test_hostile_arguments_become_tool_errors(retail_box, tool, args):
    domain, task, backend, box = retail_box
    before = state_hash(canonical_state(backend))
    res = box.call(tool, args)
    out = json.loads(res.output)
    assert not res.ok and isinstance(out, dict) and out["error"], res.output
    assert len(res.output) < 2000  # a huge argument is not echoed back
    assert state_hash(canonical_state(backend)) == before
    assert backend.conn.execute("SELECT COUNT(*) FROM orders").fetchone()[0] > 0


def test_search_syntax_in_a_query_is_just_words(retail_box):
    domain, task, backend, box = retail_box
    res = box.call("search_policy", {"query": 'refund" OR 1=1 NEAR( * ) window'})
    assert res.ok and any(hit["section"] == "Return window" for hit in json.loads(res.output))


def test_failed_call_rolls_back_partial_writes(retail_box):
    domain, task, backend, box = retail_box
    order_id = task.golden_calls[1].parameters["order_id"]
    before = state_hash(canonical_state(backend))
    # more than the order total: the refund tool raises after reading, nothing is written
    res = box.call("issue_refund", {"order_id": order_id, "amount": 10**7, "method": "store_credit"})
    assert not res.ok and "exceeds" in res.output
    assert state_hash(canonical_state(backend)) == before


def test_writes_never_reach_the_template_or_another_episode(tasks_by_id):
    task = tasks_by_id[TASK]
    domain = get_domain("retail")
    image = bytes(domain.template)
    a, b = domain.backend(task), domain.backend(task)
    box = domain.toolbox(a)
    for call in task.golden_calls:
        assert box.call(call.tool, dict(call.parameters)).ok
    assert state_hash(canonical_state(a)) != state_hash(canonical_state(b))
    assert state_hash(canonical_state(b)) == state_hash(canonical_state(domain.backend(task)))
    assert bytes(domain.template) == image


def test_two_concurrent_episodes_of_one_task_cannot_see_each_others_writes(tasks_by_id):
    """An oracle and a do-nothing agent run the same task at the same time. The do-nothing agent
    answers only after the oracle's writes are done; if backends were shared it would pass."""
    task = tasks_by_id[TASK]
    domain = get_domain("retail")
    writes_done = threading.Event()

    class SignallingOracle(OraclePolicy):
        def session(self, t, seed=0):
            inner = super().session(t, seed)

            class S:
                def complete(self, messages, tools):
                    c = inner.complete(messages, tools)
                    if inner.i >= len(inner.calls) and "<tool_call>" not in c.text:
                        writes_done.set()
                    return c
            return S()

    class WaitingNoop:
        name = "waiting-noop"

        def session(self, t, seed=0):
            return self

        def complete(self, messages, tools):
            assert writes_done.wait(30)
            return Completion("<DONE>")

    results = {}

    def go(key, policy):
        results[key] = run_episode(task, domain, policy, ScriptedUser(), KeywordJudge())

    threads = [threading.Thread(target=go, args=("noop", WaitingNoop())), threading.Thread(target=go, args=("oracle", SignallingOracle()))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert results["oracle"].passed is True
    assert results["noop"].status == "ok" and results["noop"].passed is False


def test_a_tool_bug_is_a_system_error_not_a_zero(tasks_by_id, monkeypatch):
    task = tasks_by_id[TASK]
    domain = get_domain("retail")
    broken = dict(domain.tools)
    original = broken["get_order"]

    def explode(db, order_id):
        raise RuntimeError("disk on fire")

    broken["get_order"] = type(original)(original.name, original.description, original.params, explode, False)
    monkeypatch.setattr(type(domain), "tools", property(lambda self: broken), raising=False)
    r = run_episode(task, domain, OraclePolicy(), ScriptedUser(), KeywordJudge())
    assert r.status == "system_error" and r.reward is None and r.finish_reason == "system_error"
    assert r.error_kind == "backend" and "disk on fire" in r.error


def test_a_slow_tool_times_out_as_a_system_error(tasks_by_id):
    from tbhpc.env.tools import ToolBox
    from tbhpc.errors import ToolTimeout
    domain = get_domain("retail")
    backend = domain.backend(tasks_by_id[TASK])
    reg = ToolRegistry()

    @reg.tool("spin", mutates=False, n=P("integer", "rows"))
    def spin(db, n):
        return db.conn.execute("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c) SELECT COUNT(*) FROM c").fetchone()

    box = ToolBox(backend, reg.tools, timeout_s=0.2)
    with pytest.raises(ToolTimeout):
        box.call("spin", {"n": 1})
    with pytest.raises(BackendError):
        ToolBox(backend, {"bad": type(reg.tools["spin"])("bad", "", {}, lambda db: db.conn.execute("SELECT * FROM nope"), False)}).call("bad", {})
