"""Retail task templates. Each returns a Draft: the customer's request, their private facts,
the rows to patch in, and the golden calls the manual prescribes."""
from __future__ import annotations

from tbhpc.domains.gen import Draft, Gen
from tbhpc.tasks.schema import Rubric

PRODUCTS = {  # id -> (category, price, warranty_months); mirrors seed.yaml
    "P100": ("electronics", 79.99, 12), "P101": ("electronics", 49.5, 24), "P102": ("electronics", 119.0, 24),
    "P103": ("electronics", 329.0, 24), "P104": ("electronics", 59.95, 12), "P200": ("home", 89.0, 0),
    "P201": ("kitchen", 39.99, 60), "P202": ("kitchen", 54.0, 0), "P203": ("furniture", 149.0, 24),
    "P204": ("home", 64.5, 0), "P205": ("kitchen", 72.0, 120), "P206": ("home", 44.0, 0),
    "P207": ("furniture", 259.0, 36),
}
NAMES = {"P100": "earbuds", "P101": "desk lamp", "P102": "coffee maker", "P103": "robot vacuum", "P104": "speaker",
         "P200": "duvet cover", "P201": "skillet", "P202": "dinner plates", "P203": "bookshelf", "P204": "throw blanket",
         "P205": "chef knife", "P206": "bath towels", "P207": "office chair"}
CANCEL_PHRASES = {"ordered_by_mistake": "I ordered it by mistake", "found_better_price": "I found it cheaper elsewhere",
                  "no_longer_needed": "I don't need it anymore", "delivery_too_slow": "the delivery takes too long"}


def _customer(g: Gen, tier: str | None = None) -> dict:
    name, email = g.person()
    return {"id": g.new_id("C"), "name": name, "email": email, "phone": f"555-{g.randint(1000, 9999)}",
            "tier": tier or ("gold" if g.chance(0.25) else "standard"), "store_credit": 0.0, "address": g.address()}


def _order(g: Gen, cust: dict, status: str, delivered_days_ago: int | None = None, products: list[str] | None = None) -> dict:
    products = products or [g.choice(sorted(PRODUCTS))]
    items = [{"product_id": p, "quantity": g.randint(1, 2) if PRODUCTS[p][1] < 100 else 1, "price": PRODUCTS[p][1]} for p in products]
    total = round(sum(i["price"] * i["quantity"] for i in items), 2)
    ordered = (delivered_days_ago or 0) + g.randint(3, 6) if status == "delivered" else g.randint(0, 4)
    return {"id": g.new_id("O", 2000), "customer_id": cust["id"], "status": status, "order_date": g.days_ago(ordered),
            "delivered_date": g.days_ago(delivered_days_ago) if status == "delivered" else None,
            "shipping_address": cust["address"], "items": items, "total": total, "payment_method": "card",
            "tracking_number": f"1Z{g.randint(10**9, 10**10 - 1)}" if status in ("shipped", "delivered") else None}


def _draft(g: Gen, cust: dict, orders: list[dict], query: str, goal: str, facts: dict, tags: list[str]) -> Draft:
    d = Draft(query=query, persona=f"You are {cust['name']}, a Northwind Home customer. {goal}",
              facts={"email": cust["email"], **facts}, patch={"customers": [cust], "orders": orders}, tags=tags)
    d.call("find_customer_by_email", email=cust["email"])
    return d


def order_status(g: Gen) -> Draft:
    cust = _customer(g)
    status = g.choice(["placed", "shipped", "shipped"])
    o = _order(g, cust, status)
    d = _draft(g, cust, [o], f"Hi, where is my order {o['id']}?", "You want to know the status of your order.",
               {"order id": o["id"]}, ["read_only"])
    d.call("get_order", order_id=o["id"])
    d.output_contains = [o["tracking_number"]] if status == "shipped" else ["placed"]
    d.response = (f"Your order {o['id']} has shipped; the tracking number is {o['tracking_number']}." if status == "shipped"
                  else f"Your order {o['id']} is placed and has not shipped yet.")
    return d


def cancel_placed(g: Gen) -> Draft:
    cust = _customer(g)
    o = _order(g, cust, "placed")
    other = _order(g, cust, "delivered", g.randint(20, 90))
    reason = g.choice(sorted(CANCEL_PHRASES))
    by_id = g.chance(0.5)
    q = f"Please cancel order {o['id']}." if by_id else "I want to cancel the order I placed recently."
    facts = {"order id": o["id"]} if by_id else {"order date": o["order_date"]}
    d = _draft(g, cust, [o, other], q, f"You want to cancel your most recent order because {CANCEL_PHRASES[reason]}.",
               {**facts, "reason for cancelling": CANCEL_PHRASES[reason]}, ["cancel"])
    if not by_id:
        d.call("list_orders", customer_id=cust["id"])
    d.call("get_order", order_id=o["id"]).call("search_policy", query="cancel order")
    d.call("cancel_order", order_id=o["id"], reason=reason)
    d.response = f"Order {o['id']} is cancelled. No charge was taken, so no refund is needed."
    return d


def cancel_shipped_refused(g: Gen) -> Draft:
    cust = _customer(g)
    o = _order(g, cust, "shipped")
    d = _draft(g, cust, [o], f"Cancel my order {o['id']} right now please.",
               "You want to cancel the order; insist once if refused.", {"order id": o["id"], "reason": "changed my mind"},
               ["policy", "refusal", "read_only"])
    d.call("get_order", order_id=o["id"]).call("search_policy", query="cancel shipped order")
    d.rubrics = [Rubric("Does the message tell the customer the order already shipped and cannot be cancelled?",
                        ("already shipped", "has shipped", "cannot be cancelled", "can't be cancelled"))]
    d.response = f"Order {o['id']} has already shipped, so it cannot be cancelled; you can return it once it is delivered."
    return d


def address_change(g: Gen) -> Draft:
    cust = _customer(g)
    shipped = g.chance(0.5)
    o = _order(g, cust, "shipped" if shipped else "placed")
    new_addr = g.address()
    d = _draft(g, cust, [o], f"I moved! Can you send order {o['id']} to my new address?",
               "You want your order delivered to your new address.", {"order id": o["id"], "new address": new_addr},
               ["address", "policy"] if shipped else ["address"])
    d.call("get_order", order_id=o["id"]).call("search_policy", query="change shipping address")
    if shipped:
        d.call("create_ticket", requester_id=cust["id"], subject=f"Carrier redirect for {o['id']}",
               description=f"Redirect order {o['id']} to {new_addr}", type="task", priority="high", tags=["carrier_redirect"])
        d.response = "Your order has shipped, so I asked our logistics team to request a carrier redirect."
    else:
        d.call("update_shipping_address", order_id=o["id"], address=new_addr)
        d.response = f"Order {o['id']} will now ship to {new_addr}."
    return d


def _window(cat: str, tier: str) -> int:
    return (15 if cat == "electronics" else 30) + (15 if tier == "gold" else 0)


def change_of_mind_return(g: Gen) -> Draft:
    cust = _customer(g)
    pid = g.choice(sorted(PRODUCTS))
    cat, price, _ = PRODUCTS[pid]
    window = _window(cat, cust["tier"])
    days = g.choice([window - g.randint(1, 5), window, window + g.randint(1, 6), window - 10 if window > 12 else 2])
    o = _order(g, cust, "delivered", days, [pid])
    qty = o["items"][0]["quantity"]
    credit = g.chance(0.3)
    pref = "store credit" if credit else "a refund to my card"
    d = _draft(g, cust, [o], f"I'd like to return the {NAMES[pid]} from order {o['id']}, I changed my mind.",
               f"You want to return every unit of the {NAMES[pid]} and would like {pref}.",
               {"order id": o["id"], "quantity": str(qty), "preferred refund": pref}, ["return", "policy", f"window:{window}"])
    d.call("get_order", order_id=o["id"]).call("get_product", product_id=pid).call("search_policy", query="return window change of mind")
    if days <= window:
        d.call("create_return", order_id=o["id"], product_id=pid, quantity=qty, reason="changed_mind",
               resolution="store_credit" if credit else "refund")
        d.call("issue_refund", order_id=o["id"], amount=round(price * qty, 2), method="store_credit" if credit else "original_payment")
        d.response = f"Your return is open and {price * qty:.2f} USD has been refunded " + ("as store credit." if credit else "to your card.")
    else:
        d.decline("Does the message tell the customer the return window has passed?", ("window has passed", "outside the return window", "return window has", "no longer eligible"),
                  "I'm sorry, the return window has passed, so I can't accept this return.")
    return d


def defective(g: Gen) -> Draft:
    cust = _customer(g, "standard")
    pid = g.choice([p for p, v in PRODUCTS.items() if v[2] > 0])
    cat, price, months = PRODUCTS[pid]
    covered = g.chance(0.7)
    days = g.randint(35, months * 30) if covered and months * 30 > 35 else months * 30 + g.randint(5, 120)
    covered = days <= months * 30
    o = _order(g, cust, "delivered", days, [pid])
    d = _draft(g, cust, [o], f"My {NAMES[pid]} from order {o['id']} stopped working. What can you do?",
               f"Your {NAMES[pid]} broke; you want a working one.", {"order id": o["id"], "problem": "it does not turn on"},
               ["defective", "policy"])
    d.call("get_order", order_id=o["id"]).call("get_product", product_id=pid).call("search_policy", query="defective product warranty")
    if covered:
        d.call("create_return", order_id=o["id"], product_id=pid, quantity=1, reason="defective", resolution="exchange")
        d.response = "It is under warranty, so I opened an exchange for you."
    else:
        d.decline("Does the message tell the customer the warranty has expired?", ("warranty has expired", "warranty expired", "out of warranty", "no longer under warranty"),
                  "I'm sorry, the warranty has expired, so I cannot exchange it.")
    return d


def damaged_in_transit(g: Gen) -> Draft:
    cust = _customer(g)
    pid = g.choice(sorted(PRODUCTS))
    cat, price, months = PRODUCTS[pid]
    days = g.randint(0, 7)
    o = _order(g, cust, "delivered", days, [pid])
    qty = o["items"][0]["quantity"]
    d = _draft(g, cust, [o], f"The {NAMES[pid]} in order {o['id']} arrived broken, the box was crushed.",
               "Your delivery arrived damaged; you want your money back.", {"order id": o["id"], "quantity damaged": str(qty)},
               ["damaged", "policy"])
    d.call("get_order", order_id=o["id"]).call("search_policy", query="damaged in transit")
    d.call("create_return", order_id=o["id"], product_id=pid, quantity=qty, reason="damaged_in_transit", resolution="refund")
    d.call("issue_refund", order_id=o["id"], amount=round(price * qty, 2), method="original_payment")
    d.response = f"I opened a return and refunded {price * qty:.2f} USD to your card."
    return d


def wrong_item(g: Gen) -> Draft:
    cust = _customer(g)
    pid = g.choice(sorted(PRODUCTS))
    o = _order(g, cust, "delivered", g.randint(1, 20), [pid])
    d = _draft(g, cust, [o], f"Order {o['id']} came with the wrong product inside, not the {NAMES[pid]} I ordered.",
               "You received the wrong product and want what you ordered.", {"order id": o["id"]}, ["wrong_item"])
    d.call("get_order", order_id=o["id"]).call("search_policy", query="wrong item received")
    d.call("create_return", order_id=o["id"], product_id=pid, quantity=1, reason="wrong_item", resolution="exchange")
    d.response = "I opened an exchange; the right product will be sent."
    return d


def cancel_and_move(g: Gen) -> Draft:
    cust = _customer(g)
    a, b = _order(g, cust, "placed"), _order(g, cust, "placed")
    reason = g.choice(sorted(CANCEL_PHRASES))
    new_addr = g.address()
    d = _draft(g, cust, [a, b], f"Two things: cancel order {a['id']}, and ship order {b['id']} to my new place.",
               f"You want to cancel one order ({CANCEL_PHRASES[reason]}) and redirect the other to your new address.",
               {"order to cancel": a["id"], "order to redirect": b["id"], "new address": new_addr,
                "reason for cancelling": CANCEL_PHRASES[reason]}, ["multi_intent", "cancel", "address"])
    d.call("get_order", order_id=a["id"]).call("get_order", order_id=b["id"]).call("search_policy", query="cancel order")
    d.call("cancel_order", order_id=a["id"], reason=reason)
    d.call("update_shipping_address", order_id=b["id"], address=new_addr)
    d.response = f"Order {a['id']} is cancelled and order {b['id']} will ship to {new_addr}."
    return d


TEMPLATES = {
    "order_status": (order_status, 14),
    "cancel_placed": (cancel_placed, 14),
    "cancel_shipped_refused": (cancel_shipped_refused, 10),
    "address_change": (address_change, 14),
    "change_of_mind_return": (change_of_mind_return, 24),
    "defective": (defective, 14),
    "damaged_in_transit": (damaged_in_transit, 12),
    "wrong_item": (wrong_item, 10),
    "cancel_and_move": (cancel_and_move, 12),
}
