"""Demo travel (Skyway Air, compact): a cancellation decided by fare and days to departure, an
extra bag decided by the bags already on the booking."""
from __future__ import annotations

from tbhpc.domains.demo import demo_domain, require_row
from tbhpc.domains.demo.cases import Case, act, call, refuse
from tbhpc.domains.gen import Gen
from tbhpc.env.db import Backend, Table, cols
from tbhpc.env.tools import P, ToolError, ToolRegistry

TABLES = (Table("bookings", cols("id status fare days bags refund", days="int", bags="int")),)
tools = ToolRegistry()


@tools.tool("Look up a booking.", mutates=False, booking_id=P("string", "Booking id"))
def get_booking(db: Backend, booking_id):
    b = require_row(db, "bookings", booking_id, "booking")
    return {k: b[k] for k in ("fare", "days", "bags")}


@tools.tool("Cancel a booking.", booking_id=P("string", "Booking id"),
            refund=P("string", "Refund kind", enum=("full", "credit")))
def cancel_booking(db: Backend, booking_id, refund):
    b = require_row(db, "bookings", booking_id, "booking")
    if b["status"] != "booked":
        raise ToolError(f"booking {booking_id} is {b['status']}")
    db.update("bookings", booking_id, status="cancelled", refund=refund)
    return {"status": "cancelled"}


@tools.tool("Add a checked bag.", booking_id=P("string", "Booking id"))
def add_bag(db: Backend, booking_id):
    b = require_row(db, "bookings", booking_id, "booking")
    if b["bags"] >= 3:
        raise ToolError("at most 3 bags")
    db.update("bookings", booking_id, bags=b["bags"] + 1)
    return {"bags": b["bags"] + 1}


DOMAIN = demo_domain("demo_travel", TABLES, tools)


def _case(g: Gen, b: dict, query: str, goal: str, branches: dict, branch: str) -> Case:
    name, _ = g.person()
    return Case(query=query, persona=f"You are {name}, a Skyway Air passenger. {goal}", facts={"booking id": b["id"]},
                patch={"bookings": [b]}, reads=(call("get_booking", booking_id=b["id"]),), ref=b["id"],
                branches=branches, branch=branch)


def _booking(g: Gen, **row) -> dict:
    return {"id": f"B{g.randint(1000, 9999)}", "status": "booked", "refund": None, **row}


def cancel(g: Gen) -> Case:
    branch = g.choice(["full", "credit", "refuse"])
    fare = "flex" if branch == "full" else "basic"
    days = g.randint(1, 40) if branch == "full" else g.randint(7, 40) if branch == "credit" else g.randint(0, 6)
    b = _booking(g, fare=fare, days=days, bags=g.randint(0, 1))
    query = g.choice(["Please cancel booking {}.", "I need to cancel my flight {}."]).format(b["id"])
    return _case(g, b, query, "You want the flight cancelled.", {
        "full": act(call("cancel_booking", booking_id=b["id"], refund="full"), response="Cancelled with a full refund."),
        "credit": act(call("cancel_booking", booking_id=b["id"], refund="credit"), response="Cancelled; you get a travel credit."),
        "refuse": refuse("Does the message say the booking cannot be cancelled?", ("cannot be cancelled",),
                         "Sorry, this booking cannot be cancelled this close to departure."),
    }, branch)


def bag(g: Gen) -> Case:
    branch = g.choice(["add", "refuse"])
    b = _booking(g, fare=g.choice(["flex", "basic"]), days=g.randint(1, 40), bags=g.randint(0, 1) if branch == "add" else 2)
    query = g.choice(["Can I add a bag to booking {}?", "I'd like an extra checked bag on {}."]).format(b["id"])
    return _case(g, b, query, "You want one more checked bag.", {
        "add": act(call("add_bag", booking_id=b["id"]), response="I added a checked bag."),
        "refuse": refuse("Does the message say the bag limit is reached?", ("limit is reached",),
                         "Sorry, the bag limit is reached."),
    }, branch)


TEMPLATES = {"cancel": cancel, "bag": bag}
