"""Neobank task templates: each patches its own customer, accounts, cards and transactions."""
from __future__ import annotations

from tbhpc.domains.gen import Draft, Gen

MERCHANTS = ["Corner Grocer", "Metro Transit", "StreamPlus", "Bolt Electronics", "Cafe Lumen", "Gearhub Online", "Skyline Air"]
STORIES = {"unauthorized": "I never made this purchase", "duplicate": "I was charged twice for the same thing",
           "not_received": "I paid but the order never arrived"}


def _setup(g: Gen, plan: str | None = None, kyc: str = "verified", savings: bool = False):
    name, email = g.person()
    cust = {"id": g.new_id("C"), "name": name, "email": email, "plan": plan or g.choice(["free", "free", "plus"]), "kyc_status": kyc}
    chk = {"id": g.new_id("A", 1000), "customer_id": cust["id"], "type": "checking", "balance": g.money(200, 4000), "status": "active"}
    accounts = [chk]
    if savings:
        accounts.append({"id": g.new_id("A", 1000), "customer_id": cust["id"], "type": "savings", "balance": g.money(500, 9000), "status": "active"})
    card = {"id": g.new_id("K", 2000), "account_id": chk["id"], "last4": f"{g.randint(0, 9999):04d}", "status": "active",
            "daily_limit": float(g.choice([500, 1000, 1500])), "block_reason": None}
    return cust, accounts, card


def _draft(cust, accounts, card, query, goal, facts, tags, extra=None) -> Draft:
    patch = {"customers": [cust], "accounts": accounts, "cards": [card], **(extra or {})}
    d = Draft(query=query, persona=f"You are {cust['name']}, a Fernbank customer. {goal}",
              facts={"email": cust["email"], **facts}, patch=patch, tags=tags)
    d.call("find_customer_by_email", email=cust["email"]).call("list_accounts", customer_id=cust["id"])
    return d


def lost_card(g: Gen) -> Draft:
    cust, accounts, card = _setup(g)
    how = g.choice(["lost", "stolen"])
    express = g.chance(0.5)
    fee = 15.0 if express and cust["plan"] != "plus" else 0.0
    d = _draft(cust, accounts, card, f"My card was {how}! Please help.", f"Your card was {how} and you need a new one.",
               {"card last four digits": card["last4"], "sure it is gone": "yes", "delivery": "express" if express else "standard"},
               ["card", "policy", cust["plan"]])
    d.call("search_policy", query="lost stolen card replacement fee")
    d.call("block_card", card_id=card["id"], reason=how)
    d.call("order_replacement_card", card_id=card["id"], delivery="express" if express else "standard", fee=fee)
    d.response = f"Your card is blocked and a replacement is on its way (fee {fee:.2f} USD)."
    return d


def misplaced_card(g: Gen) -> Draft:
    cust, accounts, card = _setup(g)
    d = _draft(cust, accounts, card, "I can't find my card, it might be somewhere at home.", "You misplaced your card and may still find it.",
               {"card last four digits": card["last4"], "sure it is gone": "no, I might find it"}, ["card", "policy"])
    d.call("search_policy", query="misplaced card freeze").call("freeze_card", card_id=card["id"])
    d.response = "Your card is frozen; unfreeze it in the app once you find it."
    return d


def found_card(g: Gen) -> Draft:
    cust, accounts, card = _setup(g)
    card["status"] = "frozen"
    d = _draft(cust, accounts, card, "Good news, I found my card. Can you turn it back on?", "You found your frozen card.",
               {"card last four digits": card["last4"]}, ["card"])
    d.call("unfreeze_card", card_id=card["id"])
    d.response = "Your card is active again."
    return d


def damaged_card(g: Gen) -> Draft:
    cust, accounts, card = _setup(g)
    d = _draft(cust, accounts, card, "My card is cracked and the chip barely works.", "Your card is damaged; you want a new one.",
               {"card last four digits": card["last4"]}, ["card", "policy"])
    d.call("search_policy", query="damaged card replacement")
    d.call("order_replacement_card", card_id=card["id"], delivery="standard", fee=0.0)
    d.response = "A standard replacement is ordered; keep using your card until it arrives."
    return d


def dispute(g: Gen) -> Draft:
    cust, accounts, card = _setup(g)
    acct = accounts[0]
    days = g.choice([g.randint(0, 59), 60, g.randint(61, 120), g.randint(0, 59)])
    status = "pending" if g.chance(0.15) else "posted"
    amount = g.choice([g.money(10, 500), 500.0, g.money(501, 1500)])
    reason = g.choice(sorted(STORIES))
    merchant = g.choice(MERCHANTS)
    txs = [{"id": g.new_id("T", 3000), "account_id": acct["id"], "date": g.days_ago(days), "merchant": merchant, "amount": amount, "status": status}]
    txs += [{"id": g.new_id("T", 3000), "account_id": acct["id"], "date": g.days_ago(g.randint(0, 90)), "merchant": g.choice(MERCHANTS),
             "amount": g.money(5, 300), "status": "posted"} for _ in range(2)]
    d = _draft(cust, accounts, card, f"There's a {amount:.2f} charge from {merchant} I want to dispute.", f"You want to dispute a charge: {STORIES[reason]}.",
               {"merchant": merchant, "amount": f"{amount:.2f}", "what happened": STORIES[reason]}, ["dispute", "policy"], {"transactions": txs})
    d.call("list_transactions", account_id=acct["id"]).call("search_policy", query="dispute transaction window provisional credit")
    if status == "pending":
        d.decline("Does the message tell the customer to wait until the transaction posts?", ("pending", "posts", "wait"),
                  "The transaction is still pending; please wait until it posts, then we can dispute it.")
    elif days > 60:
        d.decline("Does the message say the 60-day dispute window has passed?", ("60-day", "60 days"),
                  "I'm sorry, the 60-day dispute window has passed.")
    else:
        d.call("open_dispute", transaction_id=txs[0]["id"], reason=reason, provisional_credit=amount if amount <= 500 else 0.0)
        d.response = "The dispute is open" + (f" and {amount:.2f} USD is credited provisionally." if amount <= 500 else ".")
    return d


def limit_change(g: Gen) -> Draft:
    kyc = "pending" if g.chance(0.2) else "verified"
    cust, accounts, card = _setup(g, kyc=kyc)
    want = float(g.choice([1800, 2500, 3000, 4500, 6000]))
    cap = 2000.0 if cust["plan"] == "free" else 5000.0
    d = _draft(cust, accounts, card, f"Please raise my card's daily limit to {want:.0f} dollars.", "You want a higher daily limit.",
               {"card last four digits": card["last4"], "desired limit": f"{want:.0f}"}, ["limit", "policy", cust["plan"]])
    d.call("search_policy", query="daily card limit plan maximum")
    if kyc == "pending":
        d.decline("Does the message say identity verification must be completed first?", ("verification", "verify"),
                  "Identity verification must be completed before the limit can change.", refusal=True)
    else:
        d.call("set_card_limit", card_id=card["id"], daily_limit=min(want, cap))
        d.response = f"Your daily limit is now {min(want, cap):.0f} USD."
    return d


def transfer(g: Gen) -> Draft:
    cust, accounts, card = _setup(g, savings=True)
    chk, sav = accounts
    to_savings = g.chance(0.5)
    src = chk if to_savings else sav
    amount = float(g.randint(1, int(src["balance"] // 50)) * 50) if src["balance"] >= 50 else 10.0
    direction = "from checking to savings" if to_savings else "from savings to checking"
    d = _draft(cust, accounts, card, f"Move {amount:.0f} dollars {direction}, please.", "You want to move money between your accounts.",
               {"amount": f"{amount:.0f}", "direction": direction}, ["transfer"])
    d.call("transfer_between_accounts", from_account=src["id"], to_account=(sav if to_savings else chk)["id"], amount=amount)
    d.response = f"Moved {amount:.2f} USD {direction}."
    return d


def balance_lookup(g: Gen) -> Draft:
    cust, accounts, card = _setup(g)
    d = _draft(cust, accounts, card, "What's my checking balance?", "You want your balance.", {}, ["read_only"])
    d.output_contains = [f"{accounts[0]['balance']:.2f}"]
    d.response = f"Your checking balance is {accounts[0]['balance']:.2f} USD."
    return d


TEMPLATES = {
    "lost_card": (lost_card, 18),
    "misplaced_card": (misplaced_card, 10),
    "found_card": (found_card, 8),
    "damaged_card": (damaged_card, 10),
    "dispute": (dispute, 32),
    "limit_change": (limit_change, 18),
    "transfer": (transfer, 14),
    "balance_lookup": (balance_lookup, 10),
}
