"""Demo retail (Northwind Home, compact): cancel, return and late-delivery credit, each decided by
one order's status, days since delivery, tier or days late."""
from __future__ import annotations

from tbhpc.domains.demo import demo_domain, require_row
from tbhpc.domains.demo.cases import Case, act, call, refuse
from tbhpc.domains.gen import Gen
from tbhpc.env.db import Backend, Table, cols
from tbhpc.env.tools import P, ToolError, ToolRegistry

TABLES = (
    Table("orders", cols("id status tier days late total", days="int", late="int", total="real")),
    Table("returns", cols("id order_id"), id_prefix="R"),
    Table("credits", cols("id order_id amount", amount="int"), id_prefix="CR"),
)
tools = ToolRegistry()


@tools.tool("Look up an order.", mutates=False, order_id=P("string", "Order id"))
def get_order(db: Backend, order_id):
    o = require_row(db, "orders", order_id, "order")
    return {k: o[k] for k in ("status", "tier", "days", "late") if o[k] is not None}


@tools.tool("Cancel an order.", order_id=P("string", "Order id"))
def cancel_order(db: Backend, order_id):
    o = require_row(db, "orders", order_id, "order")
    if o["status"] not in ("placed", "shipped"):     # a shipped order is refused by the rules, not by the tool
        raise ToolError(f"order {order_id} is {o['status']}")
    db.update("orders", order_id, status="cancelled")
    return {"status": "cancelled"}


@tools.tool("Open a return for a delivered order.", order_id=P("string", "Order id"))
def create_return(db: Backend, order_id):
    o = require_row(db, "orders", order_id, "order")
    if o["status"] != "delivered":
        raise ToolError(f"order {order_id} is {o['status']}")
    return {"return": db.insert("returns", {"order_id": order_id})["id"]}


@tools.tool("Give store credit for an order.", order_id=P("string", "Order id"),
            amount=P("integer", "Credit in USD", enum=(10, 20)))
def add_credit(db: Backend, order_id, amount):
    require_row(db, "orders", order_id, "order")
    return {"credit": db.insert("credits", {"order_id": order_id, "amount": amount})["id"]}


DOMAIN = demo_domain("demo_retail", TABLES, tools)
WINDOW = {"standard": 30, "gold": 45}


def _order(g: Gen, **row) -> dict:
    return {"id": f"O{g.randint(1000, 9999)}", "tier": g.choice(["standard", "gold"]), "days": None, "late": None,
            "total": float(g.randint(20, 300)), **row}


def _case(g: Gen, o: dict, query: str, goal: str, branches: dict, branch: str) -> Case:
    name, _ = g.person()
    return Case(query=query, persona=f"You are {name}, a Northwind Home customer. {goal}", facts={"order id": o["id"]},
                patch={"orders": [o]}, reads=(call("get_order", order_id=o["id"]),), ref=o["id"],
                branches=branches, branch=branch)


def cancel(g: Gen) -> Case:
    branch = g.choice(["cancel", "refuse"])
    o = _order(g, status="placed" if branch == "cancel" else "shipped")
    query = g.choice(["Please cancel order {}.", "I want to cancel my order {}.", "Can you cancel {} for me?"]).format(o["id"])
    return _case(g, o, query, "You want the order cancelled.", {
        "cancel": act(call("cancel_order", order_id=o["id"]), response="Your order is cancelled."),
        "refuse": refuse("Does the message say the order has already shipped?", ("already shipped",),
                         "Sorry, the order has already shipped, so it cannot be cancelled."),
    }, branch)


def return_item(g: Gen) -> Case:
    branch = g.choice(["return", "refuse"])
    tier = g.choice(["standard", "gold"])
    w = WINDOW[tier]
    days = w - g.randint(0, 14) if branch == "return" else w + g.randint(1, 14)
    o = _order(g, status="delivered", tier=tier, days=days)
    query = g.choice(["I'd like to return order {}.", "Can I return the item from order {}?", "I want to send back order {}."]).format(o["id"])
    return _case(g, o, query, "You want to return the item.", {
        "return": act(call("create_return", order_id=o["id"]), response="Your return is open."),
        "refuse": refuse("Does the message say the return window has passed?", ("window has passed",),
                         "Sorry, the return window has passed."),
    }, branch)


def late_credit(g: Gen) -> Case:
    branch = g.choice(["credit_10", "credit_20", "refuse"])
    tier = "gold" if branch == "credit_20" else "standard" if branch == "credit_10" else g.choice(["standard", "gold"])
    late = g.randint(5, 15) if branch != "refuse" else g.randint(0, 4)
    o = _order(g, status="delivered", tier=tier, days=g.randint(1, 10), late=late)
    query = g.choice(["Order {} arrived late. Can I get some credit?", "My order {} was delivered late, I want compensation."]).format(o["id"])
    credit = {t: act(call("add_credit", order_id=o["id"], amount=a), response=f"I added {a} USD of store credit.")
              for t, a in (("credit_10", 10), ("credit_20", 20))}
    return _case(g, o, query, "You want store credit for the late delivery.", {
        **credit,
        "refuse": refuse("Does the message say the delay is too short for credit?", ("too short",),
                         "Sorry, the delay is too short for credit."),
    }, branch)


TEMPLATES = {"cancel": cancel, "return": return_item, "late_credit": late_credit}
