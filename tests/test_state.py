"""Canonical state: volatile fields and order ignored, structured fields graded, diffs readable."""
from tbhpc.domains import get_domain
from tbhpc.env.state import canonical_state, diff_states, state_hash


def _fresh():
    return get_domain("retail").backend()


def test_volatile_fields_and_insert_order_do_not_change_the_hash():
    a, b = _fresh(), _fresh()
    row = dict(requester_id="C1", status="new", priority="high", type="task", assignee_id=None, tags=["b", "a"])
    a.insert("tickets", {**row, "id": "TK7", "subject": "one", "description": "x", "created_at": "2025-01-01"})
    a.insert("tickets", {**row, "id": "TK8", "subject": "two"})
    b.insert("tickets", {**row, "id": "TK8", "subject": "completely different", "tags": ["a", "b"]})
    b.insert("tickets", {**row, "id": "TK7", "description": "other words", "updated_at": "2030-01-01"})
    assert state_hash(canonical_state(a)) == state_hash(canonical_state(b))


def test_structured_fields_are_graded_and_diffed():
    a, b = _fresh(), _fresh()
    b.update("orders", "O1", status="cancelled")
    b.insert("refunds", {"order_id": "O1", "amount": 5.0, "method": "store_credit"})
    sa, sb = canonical_state(a), canonical_state(b)
    assert state_hash(sa) != state_hash(sb)
    diff = diff_states(sb, sa)
    assert any(line.startswith("orders[O1]: status: 'cancelled' != golden 'delivered'") for line in diff), diff
    assert any(line.startswith("refunds[RF1]: unexpected row") for line in diff), diff
    assert diff_states(sa, sb)[-1].startswith("refunds[RF1]: missing")


def test_float_noise_does_not_flip_the_hash():
    a, b = _fresh(), _fresh()
    a.update("customers", "C1", store_credit=0.1 + 0.2)
    b.update("customers", "C1", store_credit=0.3)
    assert state_hash(canonical_state(a)) == state_hash(canonical_state(b))


def test_sequential_ids_are_deterministic():
    a = _fresh()
    ids = [a.insert("returns", {"order_id": "O1", "product_id": "P200", "quantity": 1})["id"] for _ in range(3)]
    assert ids == ["R1", "R2", "R3"]
    a.delete("returns", "R2")
    assert a.next_id("returns") == "R4"  # count+1 = 3 is taken, so skip to the next free one
