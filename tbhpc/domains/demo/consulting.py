"""Demo consulting (Ledgerline, compact): a payment extension decided by the invoice's status and
the client's tier, a discount decided by tier and amount."""
from __future__ import annotations

from tbhpc.domains.demo import demo_domain, require_row
from tbhpc.domains.demo.cases import Case, act, call, refuse
from tbhpc.domains.gen import Gen
from tbhpc.env.db import Backend, Table, cols
from tbhpc.env.tools import P, ToolRegistry

TABLES = (Table("invoices", cols("id status tier amount extended discount", amount="int", extended="int", discount="int")),)
tools = ToolRegistry()


@tools.tool("Look up an invoice.", mutates=False, invoice_id=P("string", "Invoice id"))
def get_invoice(db: Backend, invoice_id):
    i = require_row(db, "invoices", invoice_id, "invoice")
    return {k: i[k] for k in ("status", "tier", "amount")}


@tools.tool("Extend an invoice's due date.", invoice_id=P("string", "Invoice id"),
            days=P("integer", "Extra days", enum=(14, 30)))
def extend_due(db: Backend, invoice_id, days):
    require_row(db, "invoices", invoice_id, "invoice")
    db.update("invoices", invoice_id, extended=days)
    return {"extended": days}


@tools.tool("Apply a discount to an invoice.", invoice_id=P("string", "Invoice id"),
            percent=P("integer", "Discount percent", enum=(5, 10)))
def apply_discount(db: Backend, invoice_id, percent):
    require_row(db, "invoices", invoice_id, "invoice")
    db.update("invoices", invoice_id, discount=percent)
    return {"discount": percent}


DOMAIN = demo_domain("demo_consulting", TABLES, tools)


def _case(g: Gen, inv: dict, query: str, goal: str, branches: dict, branch: str) -> Case:
    name, _ = g.person()
    return Case(query=query, persona=f"You are {name}, a Ledgerline client. {goal}", facts={"invoice id": inv["id"]},
                patch={"invoices": [inv]}, reads=(call("get_invoice", invoice_id=inv["id"]),), ref=inv["id"],
                branches=branches, branch=branch)


def _invoice(g: Gen, **row) -> dict:
    return {"id": f"INV{g.randint(1000, 9999)}", "amount": g.randint(5, 90) * 100, "extended": None, "discount": None, **row}


def extension(g: Gen) -> Case:
    branch = g.choice(["days_14", "days_30", "refuse"])
    tier = {"days_14": "standard", "days_30": "partner"}.get(branch) or g.choice(["standard", "partner"])
    inv = _invoice(g, status="overdue" if branch == "refuse" else "open", tier=tier)
    query = g.choice(["Can I have more time to pay invoice {}?", "Please extend the due date of {}."]).format(inv["id"])
    return _case(g, inv, query, "You want more time to pay.", {
        **{f"days_{d}": act(call("extend_due", invoice_id=inv["id"], days=d), response=f"The due date is {d} days later.")
           for d in (14, 30)},
        "refuse": refuse("Does the message say the invoice is already overdue?", ("already overdue",),
                         "Sorry, the invoice is already overdue and cannot be extended."),
    }, branch)


def discount(g: Gen) -> Case:
    branch = g.choice(["percent_10", "percent_5", "refuse"])
    tier = "partner" if branch == "percent_10" else "standard" if branch == "percent_5" else g.choice(["standard", "partner"])
    amount = g.randint(5, 90) * 100 if branch != "refuse" else g.randint(5, 49) * 100
    if branch != "refuse":
        amount = max(amount, 5000)
    inv = _invoice(g, status="open", tier=tier, amount=amount)
    query = g.choice(["Can I get a discount on invoice {}?", "Is there a discount for invoice {}?"]).format(inv["id"])
    return _case(g, inv, query, "You want a discount.", {
        **{f"percent_{p}": act(call("apply_discount", invoice_id=inv["id"], percent=p), response=f"I applied a {p}% discount.")
           for p in (5, 10)},
        "refuse": refuse("Does the message say the invoice is too small for a discount?", ("too small",),
                         "Sorry, the invoice is too small for a discount."),
    }, branch)


TEMPLATES = {"extension": extension, "discount": discount}
