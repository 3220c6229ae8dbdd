"""Travel task templates: each patches its own customer, flights and bookings."""
from __future__ import annotations

from tbhpc.domains.gen import Draft, Gen

ROUTES = [("SFO", "DEN"), ("JFK", "LIS"), ("ORD", "SFO"), ("SEA", "HND"), ("BOS", "ORD"), ("DEN", "JFK")]
HOTELS = {"Lisbon": [("H1", 142.0), ("H2", 199.0)], "Denver": [("H3", 129.0), ("H4", 175.0)],
          "Tokyo": [("H5", 168.0), ("H6", 121.0)], "Chicago": [("H7", 155.0), ("H8", 117.0)]}
HOTEL_NAMES = {"H1": "Alfama Courtyard", "H2": "Tagus View Suites", "H3": "Larimer Lodge", "H4": "Union Station Inn",
               "H5": "Shinjuku Garden Hotel", "H6": "Asakusa River Inn", "H7": "Lakeshore Loft", "H8": "Wicker Park House"}


def _customer(g: Gen, tier: str | None = None) -> dict:
    name, email = g.person()
    return {"id": g.new_id("C"), "name": name, "email": email,
            "loyalty_tier": tier or g.choice(["none", "none", "silver", "gold"])}


def _flight(g: Gen, route, days_ahead: int, delay: int = 0) -> dict:
    return {"id": g.new_id("F", 7000), "origin": route[0], "destination": route[1], "depart_date": g.days_ahead(days_ahead),
            "depart_time": g.choice(["07:10", "09:45", "13:20", "17:55", "21:30"]), "price": float(g.randint(12, 60) * 10),
            "delay_minutes": delay}


def _booking(g: Gen, cust, flight, fare: str | None = None, pax: int | None = None) -> dict:
    pax = pax or g.choice([1, 1, 2, 3])
    return {"id": g.new_id("B", 8000), "customer_id": cust["id"], "flight_id": flight["id"], "fare_type": fare or g.choice(["basic", "flex"]),
            "passengers": pax, "bags": 0, "paid": round(flight["price"] * pax, 2), "status": "confirmed", "change_fees": 0.0}


def _draft(cust, patch, query, goal, facts, tags) -> Draft:
    d = Draft(query=query, persona=f"You are {cust['name']}, a Skyline Trips customer. {goal}",
              facts={"email": cust["email"], **facts}, patch={"customers": [cust], **patch}, tags=tags)
    d.call("find_customer_by_email", email=cust["email"])
    return d


def cancel_flight(g: Gen) -> Draft:
    cust = _customer(g)
    days = g.choice([g.randint(8, 60), 7, g.randint(1, 6)])
    f = _flight(g, g.choice(ROUTES), days)
    b = _booking(g, cust, f)
    d = _draft(cust, {"flights": [f], "bookings": [b]}, f"I need to cancel my flight, booking {b['id']}.",
               "You can no longer travel and want to cancel; you want your money back if possible, but you cancel anyway.",
               {"booking id": b["id"], "still cancel without refund": "yes"}, ["cancel", "policy", b["fare_type"]])
    d.call("get_booking", booking_id=b["id"]).call("search_policy", query="cancel flight refund voucher")
    d.call("cancel_booking", booking_id=b["id"])
    if b["fare_type"] == "flex":
        d.call("refund_booking", booking_id=b["id"], amount=b["paid"])
        d.response = f"Cancelled; {b['paid']:.2f} USD goes back to your card."
    elif days >= 7:
        d.call("issue_voucher", customer_id=cust["id"], amount=b["paid"], reason="cancellation")
        d.response = f"Cancelled; you get a voucher for {b['paid']:.2f} USD."
    else:
        d.response = "Cancelled. A basic fare within 7 days of departure is non-refundable."
    return d


def change_flight(g: Gen) -> Draft:
    cust = _customer(g)
    route = g.choice(ROUTES)
    days = g.randint(3, 40)
    f = _flight(g, route, days)
    alt_days = days + g.randint(1, 5)
    alts = [_flight(g, route, alt_days) for _ in range(2)]
    new = g.choice(alts)
    b = _booking(g, cust, f)
    fee = 0.0 if b["fare_type"] == "flex" or cust["loyalty_tier"] == "gold" else 75.0 * b["passengers"]
    d = _draft(cust, {"flights": [f, *alts], "bookings": [b]}, f"Can I move booking {b['id']} to {new['depart_date']}?",
               f"You want to fly on {new['depart_date']} instead, on the {new['depart_time']} departure.",
               {"booking id": b["id"], "new date": new["depart_date"], "preferred departure time": new["depart_time"]},
               ["change", "policy", b["fare_type"], cust["loyalty_tier"]])
    d.call("get_booking", booking_id=b["id"]).call("search_flights", origin=route[0], destination=route[1], date=new["depart_date"])
    d.call("search_policy", query="change flight fee").call("change_flight", booking_id=b["id"], new_flight_id=new["id"], change_fee=fee)
    d.response = f"You're now on flight {new['id']} on {new['depart_date']}; change fee {fee:.2f} USD."
    return d


def add_bags(g: Gen) -> Draft:
    cust = _customer(g)
    f = _flight(g, g.choice(ROUTES), g.randint(2, 30))
    b = _booking(g, cust, f)
    count = g.randint(1, 2 * b["passengers"])
    free = b["passengers"] if cust["loyalty_tier"] in ("silver", "gold") else 0
    fee = 35.0 * max(0, count - free)
    d = _draft(cust, {"flights": [f], "bookings": [b]}, f"I'd like to add {count} checked bag{'s' if count > 1 else ''} to booking {b['id']}.",
               "You want to add checked bags.", {"booking id": b["id"], "bags to add": str(count)}, ["bags", "policy", cust["loyalty_tier"]])
    d.call("get_booking", booking_id=b["id"]).call("search_policy", query="checked bag fee allowance")
    d.call("add_bags", booking_id=b["id"], count=count, fee=fee)
    d.response = f"Added {count} bag(s) for {fee:.2f} USD."
    return d


def delay_compensation(g: Gen) -> Draft:
    cust = _customer(g)
    delay = g.choice([g.randint(180, 400), 180, g.randint(30, 179)])
    f = _flight(g, g.choice(ROUTES), -g.randint(1, 20), delay)
    b = _booking(g, cust, f)
    d = _draft(cust, {"flights": [f], "bookings": [b]}, f"My flight on booking {b['id']} was badly delayed. I want compensation.",
               "Your flight was late and you want compensation.", {"booking id": b["id"]}, ["delay", "policy"])
    d.call("get_booking", booking_id=b["id"]).call("search_policy", query="delay compensation voucher")
    if delay >= 180:
        d.call("issue_voucher", customer_id=cust["id"], amount=100.0 * b["passengers"], reason="delay")
        d.response = f"You get a {100 * b['passengers']:.0f} USD voucher for the delay."
    else:
        d.decline("Does the message say the delay does not qualify for compensation?", ("under 3 hours", "does not qualify", "doesn't qualify", "not eligible"),
                  "The delay was under 3 hours, so it does not qualify for compensation.")
    return d


def book_hotel(g: Gen) -> Draft:
    cust = _customer(g)
    city = g.choice(sorted(HOTELS))
    hid, rate = g.choice(HOTELS[city])
    check_in, nights = g.days_ahead(g.randint(5, 60)), g.randint(1, 6)
    d = _draft(cust, {}, f"I need a hotel in {city}.", f"You want to stay at {HOTEL_NAMES[hid]}.",
               {"hotel": HOTEL_NAMES[hid], "check-in date": check_in, "nights": str(nights)}, ["hotel"])
    d.call("search_hotels", city=city).call("book_hotel", customer_id=cust["id"], hotel_id=hid, check_in=check_in, nights=nights)
    d.response = f"Booked {HOTEL_NAMES[hid]} from {check_in} for {nights} night(s)."
    return d


def cancel_hotel(g: Gen) -> Draft:
    cust = _customer(g)
    city = g.choice(sorted(HOTELS))
    hid, rate = g.choice(HOTELS[city])
    days = g.choice([g.randint(0, 2), 2, 3, g.randint(4, 30)])
    r = {"id": g.new_id("HR", 9000), "customer_id": cust["id"], "hotel_id": hid, "check_in": g.days_ahead(days),
         "nights": g.randint(1, 5), "status": "confirmed", "cancellation_fee": 0.0}
    d = _draft(cust, {"hotel_reservations": [r]}, f"Please cancel my hotel reservation {r['id']}.",
               "You want to cancel your hotel stay.", {"reservation id": r["id"]}, ["hotel", "policy", "cancel"])
    d.call("list_trips", customer_id=cust["id"]).call("search_policy", query="cancel hotel fee")
    d.call("cancel_hotel", reservation_id=r["id"], fee=rate if days <= 2 else 0.0)
    d.response = "Your reservation is cancelled" + (f" with a {rate:.2f} USD fee." if days <= 2 else " free of charge.")
    return d


def booking_lookup(g: Gen) -> Draft:
    cust = _customer(g)
    f = _flight(g, g.choice(ROUTES), g.randint(1, 30))
    b = _booking(g, cust, f)
    d = _draft(cust, {"flights": [f], "bookings": [b]}, f"What time does my flight on booking {b['id']} leave?",
               "You want your departure time.", {"booking id": b["id"]}, ["read_only"])
    d.call("get_booking", booking_id=b["id"])
    d.output_contains = [f["depart_time"]]
    d.response = f"Your flight leaves on {f['depart_date']} at {f['depart_time']}."
    return d


def trip_rework(g: Gen) -> Draft:
    """Move the flight (basic, non-gold: fee) and cancel the hotel at the old destination date."""
    cust = _customer(g, g.choice(["none", "silver"]))
    route = g.choice(ROUTES)
    days = g.randint(10, 40)
    f = _flight(g, route, days)
    new = _flight(g, route, days + g.randint(2, 6))
    b = _booking(g, cust, f, fare="basic", pax=g.choice([1, 2]))
    city = g.choice(sorted(HOTELS))
    hid, rate = g.choice(HOTELS[city])
    r = {"id": g.new_id("HR", 9000), "customer_id": cust["id"], "hotel_id": hid, "check_in": f["depart_date"],
         "nights": 3, "status": "confirmed", "cancellation_fee": 0.0}
    d = _draft(cust, {"flights": [f, new], "bookings": [b], "hotel_reservations": [r]},
               f"My plans changed: move booking {b['id']} to {new['depart_date']} and cancel hotel reservation {r['id']}.",
               "You want your flight moved and your hotel cancelled.",
               {"booking id": b["id"], "new date": new["depart_date"], "reservation id": r["id"]}, ["multi_intent", "change", "hotel"])
    d.call("get_booking", booking_id=b["id"]).call("search_flights", origin=route[0], destination=route[1], date=new["depart_date"])
    d.call("search_policy", query="change fee basic fare").call("change_flight", booking_id=b["id"], new_flight_id=new["id"], change_fee=75.0 * b["passengers"])
    d.call("search_policy", query="cancel hotel").call("cancel_hotel", reservation_id=r["id"], fee=0.0)
    d.response = "Your flight is moved and the hotel is cancelled free of charge."
    return d


TEMPLATES = {
    "cancel_flight": (cancel_flight, 22),
    "change_flight": (change_flight, 18),
    "add_bags": (add_bags, 16),
    "delay_compensation": (delay_compensation, 16),
    "book_hotel": (book_hotel, 12),
    "cancel_hotel": (cancel_hotel, 14),
    "booking_lookup": (booking_lookup, 10),
    "trip_rework": (trip_rework, 12),
}
