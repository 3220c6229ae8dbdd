"""Neobank support ("Fernbank"): accounts, cards, transactions, disputes, transfers.

The manual governs card incidents (freeze vs block, replacement delivery fees by plan), dispute
eligibility and provisional credit, daily-limit caps by plan and KYC status, and transfers.
"""
from __future__ import annotations

from pathlib import Path

from tbhpc.env.db import Backend, Table, cols
from tbhpc.env.common_tools import customer_lookup
from tbhpc.env.domain import Domain
from tbhpc.env.tools import P, ToolError, require

TABLES = (
    Table("customers", cols("id name email plan kyc_status")),
    Table("accounts", cols("id customer_id type balance status", balance="real")),
    Table("cards", cols("id account_id last4 status daily_limit block_reason", daily_limit="real"), id_prefix="K"),
    Table("transactions", cols("id account_id date merchant amount status", amount="real")),
    Table("disputes", cols("id transaction_id reason status provisional_credit created_at", provisional_credit="real"),
          volatile=frozenset({"created_at"}), id_prefix="DS"),
    Table("transfers", cols("id from_account to_account amount created_at", amount="real"), volatile=frozenset({"created_at"}), id_prefix="TR"),
    Table("card_orders", cols("id replaces_card delivery fee", fee="real"), id_prefix="CO"),
)

tools = customer_lookup.merged()  # find_customer_by_email, shared


@tools.tool("List a customer's accounts with their cards.", mutates=False, customer_id=P("string", "Customer id"))
def list_accounts(db: Backend, customer_id):
    return [{**a, "cards": db.select("cards", account_id=a["id"])} for a in db.select("accounts", customer_id=customer_id)]


@tools.tool("List an account's transactions, newest first.", mutates=False, account_id=P("string", "Account id"))
def list_transactions(db: Backend, account_id):
    require(db, "accounts", account_id, "account")
    return sorted(db.select("transactions", account_id=account_id), key=lambda t: t["date"], reverse=True)


def _card_status(db: Backend, card_id: str, allowed: tuple, new: str, **extra) -> dict:
    card = require(db, "cards", card_id, "card")
    if card["status"] not in allowed:
        raise ToolError(f"card {card_id} is {card['status']}")
    return db.update("cards", card_id, status=new, **extra)


@tools.tool("Temporarily freeze a card (reversible).", card_id=P("string", "Card id"))
def freeze_card(db: Backend, card_id):
    return _card_status(db, card_id, ("active",), "frozen")


@tools.tool("Unfreeze a frozen card.", card_id=P("string", "Card id"))
def unfreeze_card(db: Backend, card_id):
    return _card_status(db, card_id, ("frozen",), "active")


@tools.tool("Permanently block a card.", card_id=P("string", "Card id"),
            reason=P("string", "Why", enum=("lost", "stolen", "fraud")))
def block_card(db: Backend, card_id, reason):
    return _card_status(db, card_id, ("active", "frozen"), "blocked", block_reason=reason)


@tools.tool("Order a replacement card, charging the given delivery fee.", card_id=P("string", "Card being replaced"),
            delivery=P("string", "Delivery speed", enum=("standard", "express")), fee=P("number", "Fee in USD per the manual", minimum=0))
def order_replacement_card(db: Backend, card_id, delivery, fee):
    card = require(db, "cards", card_id, "card")
    if db.select("card_orders", replaces_card=card_id):
        raise ToolError(f"a replacement for {card_id} is already ordered")
    row = db.insert("card_orders", {"replaces_card": card_id, "delivery": delivery, "fee": round(float(fee), 2)})
    if fee:
        acct = db.get("accounts", card["account_id"])
        db.update("accounts", acct["id"], balance=round(acct["balance"] - fee, 2))
    return {"order_id": row["id"]}


@tools.tool("Open a dispute on a transaction, with the provisional credit the manual allows.",
            transaction_id=P("string", "Transaction id"),
            reason=P("string", "Reason code", enum=("unauthorized", "duplicate", "not_received")),
            provisional_credit=P("number", "Provisional credit in USD (0 for none)", minimum=0))
def open_dispute(db: Backend, transaction_id, reason, provisional_credit):
    tx = require(db, "transactions", transaction_id, "transaction")
    if tx["status"] == "disputed":
        raise ToolError(f"transaction {transaction_id} is already disputed")
    if provisional_credit > tx["amount"] + 1e-9:
        raise ToolError("provisional credit cannot exceed the transaction amount")
    row = db.insert("disputes", {"transaction_id": transaction_id, "reason": reason, "status": "open",
                                 "provisional_credit": round(float(provisional_credit), 2), "created_at": db.today})
    db.update("transactions", transaction_id, status="disputed")
    if provisional_credit:
        acct = db.get("accounts", tx["account_id"])
        db.update("accounts", acct["id"], balance=round(acct["balance"] + provisional_credit, 2))
    return {"dispute_id": row["id"]}


@tools.tool("Set a card's daily spending limit.", card_id=P("string", "Card id"),
            daily_limit=P("number", "New daily limit in USD", minimum=0))
def set_card_limit(db: Backend, card_id, daily_limit):
    require(db, "cards", card_id, "card")
    return db.update("cards", card_id, daily_limit=float(daily_limit))


@tools.tool("Move money between two accounts of the same customer.", from_account=P("string", "Source account id"),
            to_account=P("string", "Destination account id"), amount=P("number", "Amount in USD", minimum=0.01))
def transfer_between_accounts(db: Backend, from_account, to_account, amount):
    src, dst = require(db, "accounts", from_account, "account"), require(db, "accounts", to_account, "account")
    if src["customer_id"] != dst["customer_id"]:
        raise ToolError("both accounts must belong to the same customer")
    if src["status"] != "active" or dst["status"] != "active":
        raise ToolError("both accounts must be active")
    if amount > src["balance"] + 1e-9:
        raise ToolError(f"insufficient funds: balance {src['balance']:.2f}")
    db.update("accounts", from_account, balance=round(src["balance"] - amount, 2))
    db.update("accounts", to_account, balance=round(dst["balance"] + amount, 2))
    row = db.insert("transfers", {"from_account": from_account, "to_account": to_account, "amount": round(float(amount), 2), "created_at": db.today})
    return {"transfer_id": row["id"]}


DOMAIN = Domain("neobank", Path(__file__).parent, TABLES, tools)
