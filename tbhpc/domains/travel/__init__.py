"""Travel ("Skyline Trips", flights and hotels): bookings, changes, cancellations, bags,
delay compensation, hotel stays.

The manual governs money: which fare gets a cash refund or a voucher, change fees by fare and
loyalty tier, free bag allowances, delay compensation thresholds, hotel cancellation fees. The
tools take the amounts the agent decides, so a wrong decision shows up in the final state.
"""
from __future__ import annotations

from pathlib import Path

from tbhpc.env.db import Backend, Table, cols
from tbhpc.env.common_tools import customer_lookup
from tbhpc.env.domain import Domain
from tbhpc.env.tools import P, ToolError, require, opt

TABLES = (
    Table("customers", cols("id name email loyalty_tier")),
    Table("flights", cols("id origin destination depart_date depart_time price delay_minutes", price="real", delay_minutes="int")),
    Table("bookings", cols("id customer_id flight_id fare_type passengers bags paid status change_fees",
                           passengers="int", bags="int", paid="real", change_fees="real"), id_prefix="B"),
    Table("hotels", cols("id city name nightly_rate", nightly_rate="real")),
    Table("hotel_reservations", cols("id customer_id hotel_id check_in nights status cancellation_fee",
                                     nights="int", cancellation_fee="real"), id_prefix="HR"),
    Table("vouchers", cols("id customer_id amount reason created_at", amount="real"), volatile=frozenset({"created_at"}), id_prefix="VO"),
    Table("refunds", cols("id booking_id amount created_at", amount="real"), volatile=frozenset({"created_at"}), id_prefix="RF"),
)

tools = customer_lookup.merged()  # find_customer_by_email, shared


def _booking(db: Backend, booking_id: str) -> dict:
    return require(db, "bookings", booking_id, "booking")


def _active(db: Backend, booking_id: str) -> dict:
    b = _booking(db, booking_id)
    if b["status"] != "confirmed":
        raise ToolError(f"booking {booking_id} is {b['status']}")
    return b


@tools.tool("List a customer's flight bookings and hotel reservations.", mutates=False, customer_id=P("string", "Customer id"))
def list_trips(db: Backend, customer_id):
    return {"bookings": db.select("bookings", customer_id=customer_id),
            "hotel_reservations": db.select("hotel_reservations", customer_id=customer_id)}


@tools.tool("Fetch a booking with its flight.", mutates=False, booking_id=P("string", "Booking id"))
def get_booking(db: Backend, booking_id):
    b = _booking(db, booking_id)
    return {**b, "flight": db.get("flights", b["flight_id"])}


@tools.tool("Search flights on a route and date.", mutates=False, origin=P("string", "IATA code"),
            destination=P("string", "IATA code"), date=P("string", "YYYY-MM-DD"))
def search_flights(db: Backend, origin, destination, date):
    return db.select("flights", origin=origin.upper(), destination=destination.upper(), depart_date=date)


@tools.tool("Move a booking to another flight on the same route, charging the given change fee.",
            booking_id=P("string", "Booking id"), new_flight_id=P("string", "Flight id"),
            change_fee=P("number", "Total change fee in USD per the manual (0 if waived)", minimum=0))
def change_flight(db: Backend, booking_id, new_flight_id, change_fee):
    b = _active(db, booking_id)
    old, new = db.get("flights", b["flight_id"]), require(db, "flights", new_flight_id, "flight")
    if (old["origin"], old["destination"]) != (new["origin"], new["destination"]):
        raise ToolError("a change must keep the same route")
    if new["depart_date"] < db.today:
        raise ToolError("cannot move to a flight in the past")
    return db.update("bookings", booking_id, flight_id=new_flight_id, change_fees=round((b["change_fees"] or 0) + change_fee, 2))


@tools.tool("Cancel a flight booking (no money moves; refund or voucher separately).", booking_id=P("string", "Booking id"))
def cancel_booking(db: Backend, booking_id):
    _active(db, booking_id)
    db.update("bookings", booking_id, status="cancelled")
    return {"booking_id": booking_id, "status": "cancelled"}


@tools.tool("Refund money for a booking to the original payment method.", booking_id=P("string", "Booking id"),
            amount=P("number", "Amount in USD", minimum=0.01))
def refund_booking(db: Backend, booking_id, amount):
    b = _booking(db, booking_id)
    done = sum(r["amount"] for r in db.select("refunds", booking_id=booking_id))
    if amount > b["paid"] - done + 1e-9:
        raise ToolError(f"refund exceeds the refundable {b['paid'] - done:.2f}")
    row = db.insert("refunds", {"booking_id": booking_id, "amount": round(float(amount), 2), "created_at": db.today})
    return {"refund_id": row["id"]}


@tools.tool("Issue a travel voucher to a customer.", customer_id=P("string", "Customer id"),
            amount=P("number", "Amount in USD", minimum=0.01),
            reason=P("string", "Reason code", enum=("cancellation", "delay", "goodwill")))
def issue_voucher(db: Backend, customer_id, amount, reason):
    require(db, "customers", customer_id, "customer")
    row = db.insert("vouchers", {"customer_id": customer_id, "amount": round(float(amount), 2), "reason": reason, "created_at": db.today})
    return {"voucher_id": row["id"], "amount": row["amount"]}


@tools.tool("Add checked bags to a booking, charging the given total fee.", booking_id=P("string", "Booking id"),
            count=P("integer", "Bags to add", minimum=1), fee=P("number", "Total bag fee in USD per the manual", minimum=0))
def add_bags(db: Backend, booking_id, count, fee):
    b = _active(db, booking_id)
    if b["bags"] + count > 2 * b["passengers"]:
        raise ToolError("at most 2 checked bags per passenger")
    return db.update("bookings", booking_id, bags=b["bags"] + count, paid=round(b["paid"] + fee, 2))


@tools.tool("Search hotels in a city.", mutates=False, city=P("string", "City name"))
def search_hotels(db: Backend, city):
    return db.select("hotels", city=city.strip().title())


@tools.tool("Book a hotel stay.", customer_id=P("string", "Customer id"), hotel_id=P("string", "Hotel id"),
            check_in=P("string", "YYYY-MM-DD"), nights=P("integer", "Number of nights", minimum=1))
def book_hotel(db: Backend, customer_id, hotel_id, check_in, nights):
    require(db, "hotels", hotel_id, "hotel")
    if check_in < db.today:
        raise ToolError("check-in date is in the past")
    row = db.insert("hotel_reservations", {"customer_id": customer_id, "hotel_id": hotel_id, "check_in": check_in,
                                           "nights": nights, "status": "confirmed", "cancellation_fee": 0.0})
    return {"reservation_id": row["id"]}


@tools.tool("Cancel a hotel reservation, charging the given cancellation fee.", reservation_id=P("string", "Reservation id"),
            fee=opt("number", "Cancellation fee in USD per the manual (default 0)", minimum=0))
def cancel_hotel(db: Backend, reservation_id, fee=0.0):
    r = require(db, "hotel_reservations", reservation_id, "reservation")
    if r["status"] != "confirmed":
        raise ToolError(f"reservation {reservation_id} is {r['status']}")
    return db.update("hotel_reservations", reservation_id, status="cancelled", cancellation_fee=round(float(fee), 2))


DOMAIN = Domain("travel", Path(__file__).parent, TABLES, tools)
