"""Demo neobank (Nova Bank, compact): freezing a card decided by its status, a dispute decided by
the transaction's age and amount."""
from __future__ import annotations

from tbhpc.domains.demo import demo_domain, require_row
from tbhpc.domains.demo.cases import Case, act, call, refuse
from tbhpc.domains.gen import Gen
from tbhpc.env.db import Backend, Table, cols
from tbhpc.env.tools import P, ToolRegistry

TABLES = (
    Table("cards", cols("id status")),
    Table("freezes", cols("id card_id"), id_prefix="F"),
    Table("transactions", cols("id days amount disputed", days="int", amount="int", disputed="int")),
)
tools = ToolRegistry()


@tools.tool("Look up a card.", mutates=False, card_id=P("string", "Card id"))
def get_card(db: Backend, card_id):
    return {"status": require_row(db, "cards", card_id, "card")["status"]}


@tools.tool("Freeze a card.", card_id=P("string", "Card id"))
def freeze_card(db: Backend, card_id):
    require_row(db, "cards", card_id, "card")
    db.update("cards", card_id, status="frozen")
    db.insert("freezes", {"card_id": card_id})      # logged: freezing a frozen card is a change, not a no-op
    return {"status": "frozen"}


@tools.tool("Look up a transaction.", mutates=False, txn_id=P("string", "Transaction id"))
def get_transaction(db: Backend, txn_id):
    t = require_row(db, "transactions", txn_id, "transaction")
    return {k: t[k] for k in ("days", "amount")}


@tools.tool("Open a dispute on a transaction.", txn_id=P("string", "Transaction id"))
def open_dispute(db: Backend, txn_id):
    require_row(db, "transactions", txn_id, "transaction")
    db.update("transactions", txn_id, disputed=1)
    return {"disputed": True}


DOMAIN = demo_domain("demo_neobank", TABLES, tools)


def _case(g: Gen, ref: str, query: str, goal: str, what: str, patch: dict, read, branches: dict, branch: str) -> Case:
    name, _ = g.person()
    return Case(query=query, persona=f"You are {name}, a Nova Bank customer. {goal}", facts={what: ref},
                patch=patch, reads=(read,), ref=ref, branches=branches, branch=branch)


def freeze(g: Gen) -> Case:
    branch = g.choice(["freeze", "refuse"])
    card = {"id": f"K{g.randint(1000, 9999)}", "status": "active" if branch == "freeze" else "frozen"}
    query = g.choice(["I lost my card {}, please freeze it.", "Freeze card {} now please."]).format(card["id"])
    return _case(g, card["id"], query, "You want the card frozen.", "card id", {"cards": [card]},
                 call("get_card", card_id=card["id"]), {
        "freeze": act(call("freeze_card", card_id=card["id"]), response="Your card is frozen."),
        "refuse": refuse("Does the message say the card is already frozen?", ("already frozen",),
                         "Your card is already frozen."),
    }, branch)


def dispute(g: Gen) -> Case:
    branch = g.choice(["dispute", "transfer", "refuse"])
    days = g.randint(61, 120) if branch == "refuse" else g.randint(1, 60)
    amount = g.randint(1001, 3000) if branch == "transfer" else g.randint(5, 1000)
    t = {"id": f"T{g.randint(1000, 9999)}", "days": days, "amount": amount, "disputed": 0}
    query = g.choice(["I don't recognise transaction {}. Please dispute it.", "I want to dispute the payment {}."]).format(t["id"])
    return _case(g, t["id"], query, "You want the payment disputed.", "transaction id", {"transactions": [t]},
                 call("get_transaction", txn_id=t["id"]), {
        "dispute": act(call("open_dispute", txn_id=t["id"]), response="I opened a dispute."),
        "transfer": act(call("transfer", ref=t["id"]), response="A colleague will handle this dispute."),
        "refuse": refuse("Does the message say the transaction is too old to dispute?", ("too old",),
                         "Sorry, the transaction is too old to dispute."),
    }, branch)


TEMPLATES = {"freeze": freeze, "dispute": dispute}
