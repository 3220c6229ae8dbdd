"""Retail ("Northwind Home", online home & electronics store): orders, returns, refunds.

Tools enforce hard facts (you cannot cancel a delivered order); the policy manual governs
decisions the tools allow but the business forbids (return windows by category and tier,
which resolution a reason gets, when to open a redirect ticket). Those decisions are what the
tasks test.
"""
from __future__ import annotations

from pathlib import Path

from tbhpc.env.db import Backend, Table, cols
from tbhpc.env.common_tools import customer_lookup
from tbhpc.env.domain import Domain
from tbhpc.env.tools import P, ToolError, require, opt

RETURN_REASONS = ("changed_mind", "defective", "damaged_in_transit", "wrong_item")
RESOLUTIONS = ("refund", "exchange", "store_credit")
CANCEL_REASONS = ("ordered_by_mistake", "found_better_price", "no_longer_needed", "delivery_too_slow")

TABLES = (
    Table("customers", cols("id name email phone tier store_credit address", store_credit="real")),
    Table("products", cols("id name category price warranty_months", price="real", warranty_months="int")),
    Table("orders", cols("id customer_id status order_date delivered_date shipping_address items total payment_method tracking_number",
                         items="json", total="real")),
    Table("returns", cols("id order_id product_id quantity reason resolution status created_at", quantity="int"),
          volatile=frozenset({"created_at"}), id_prefix="R"),
    Table("refunds", cols("id order_id amount method note created_at", amount="real"),
          volatile=frozenset({"note", "created_at"}), id_prefix="RF"),
)

tools = customer_lookup.merged()  # find_customer_by_email, shared


def _order(db: Backend, order_id: str) -> dict:
    return require(db, "orders", order_id, "order")


@tools.tool("Fetch a customer profile.", mutates=False, customer_id=P("string", "Customer id"))
def get_customer(db: Backend, customer_id):
    return require(db, "customers", customer_id, "customer")


@tools.tool("List a customer's orders (newest first).", mutates=False, customer_id=P("string", "Customer id"))
def list_orders(db: Backend, customer_id):
    rows = db.select("orders", customer_id=customer_id)
    return [{k: r[k] for k in ("id", "status", "order_date", "total")} for r in sorted(rows, key=lambda r: r["order_date"], reverse=True)]


@tools.tool("Fetch an order with its items.", mutates=False, order_id=P("string", "Order id, e.g. O1001"))
def get_order(db: Backend, order_id):
    return _order(db, order_id)


@tools.tool("Fetch a product: category, price, warranty.", mutates=False, product_id=P("string", "Product id"))
def get_product(db: Backend, product_id):
    return require(db, "products", product_id, "product")


@tools.tool("Cancel an order that has not shipped yet.",
            order_id=P("string", "Order id"), reason=P("string", "Cancellation reason code", enum=CANCEL_REASONS))
def cancel_order(db: Backend, order_id, reason):
    order = _order(db, order_id)
    if order["status"] != "placed":
        raise ToolError(f"order {order_id} is {order['status']}; only placed orders can be cancelled")
    db.update("orders", order_id, status="cancelled")
    return {"order_id": order_id, "status": "cancelled", "reason": reason}


@tools.tool("Change the shipping address of an order that has not shipped yet.",
            order_id=P("string", "Order id"), address=P("string", "Full new address", max_length=300))
def update_shipping_address(db: Backend, order_id, address):
    order = _order(db, order_id)
    if order["status"] != "placed":
        raise ToolError(f"order {order_id} is {order['status']}; the address can only change before shipping")
    return db.update("orders", order_id, shipping_address=address.strip())


@tools.tool("Open a return for one product of a delivered order.",
            order_id=P("string", "Order id"), product_id=P("string", "Product id in that order"),
            quantity=P("integer", "How many units", minimum=1),
            reason=P("string", "Return reason code", enum=RETURN_REASONS),
            resolution=P("string", "What the customer gets", enum=RESOLUTIONS))
def create_return(db: Backend, order_id, product_id, quantity, reason, resolution):
    order = _order(db, order_id)
    if order["status"] != "delivered":
        raise ToolError(f"order {order_id} is {order['status']}; only delivered orders can be returned")
    line = next((i for i in order["items"] if i["product_id"] == product_id), None)
    if line is None:
        raise ToolError(f"product {product_id} is not in order {order_id}")
    already = sum(r["quantity"] for r in db.select("returns", order_id=order_id, product_id=product_id))
    if quantity + already > line["quantity"]:
        raise ToolError(f"only {line['quantity'] - already} unit(s) of {product_id} left to return")
    row = db.insert("returns", {"order_id": order_id, "product_id": product_id, "quantity": quantity,
                                "reason": reason, "resolution": resolution, "status": "approved", "created_at": db.today})
    return {"return_id": row["id"], "status": row["status"]}


@tools.tool("Refund money on an order, to the original payment method or as store credit.",
            order_id=P("string", "Order id"), amount=P("number", "Amount in USD", minimum=0.01),
            method=P("string", "Where the money goes", enum=("original_payment", "store_credit")),
            note=opt("string", "Internal note", max_length=500))
def issue_refund(db: Backend, order_id, amount, method, note=""):
    order = _order(db, order_id)
    refunded = sum(r["amount"] for r in db.select("refunds", order_id=order_id))
    amount = round(float(amount), 2)
    if amount > round(order["total"] - refunded, 2) + 1e-9:
        raise ToolError(f"refund {amount:.2f} exceeds the refundable balance {order['total'] - refunded:.2f}")
    row = db.insert("refunds", {"order_id": order_id, "amount": amount, "method": method, "note": note, "created_at": db.today})
    if method == "store_credit":
        cust = db.get("customers", order["customer_id"])
        db.update("customers", cust["id"], store_credit=round((cust["store_credit"] or 0) + amount, 2))
    return {"refund_id": row["id"], "amount": amount, "method": method}


DOMAIN = Domain("retail", Path(__file__).parent, TABLES, tools)
