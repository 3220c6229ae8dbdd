"""Auto insurance ("Harbor Mutual"): policies, vehicles, drivers, claims, premium refunds.

Tools enforce structure (a claim must name a vehicle on the policy); the manual governs the
decisions: claim deadlines, glass fast-track limits, which plans may cover business use or young
drivers, deductible changes while a claim is open, the cancellation cooling-off refund.
"""
from __future__ import annotations

from pathlib import Path

from tbhpc.env.db import Backend, Table, cols
from tbhpc.env.common_tools import customer_lookup
from tbhpc.env.domain import Domain
from tbhpc.env.tools import P, ToolError, require, opt

CLAIM_TYPES = ("collision", "glass", "theft", "weather")
PLAN_RATES = {"basic": 38.0, "standard": 55.0, "premium": 82.0}  # monthly premium per vehicle

TABLES = (
    Table("customers", cols("id name email phone birth_date")),
    Table("policies", cols("id customer_id plan status deductible premium_monthly start_date end_date",
                           deductible="int", premium_monthly="real")),
    Table("vehicles", cols("id policy_id vin make model year usage", year="int"), id_prefix="V"),
    Table("drivers", cols("id policy_id name license_number birth_date"), id_prefix="D"),
    Table("claims", cols("id policy_id vehicle_id type status incident_date amount_claimed fast_track description created_at",
                         amount_claimed="real", fast_track="bool"),
          volatile=frozenset({"description", "created_at"}), id_prefix="CL"),
    Table("payments", cols("id policy_id amount kind note created_at", amount="real"),
          volatile=frozenset({"note", "created_at"}), id_prefix="PAY"),
)

tools = customer_lookup.merged()  # find_customer_by_email, shared


def _policy(db: Backend, policy_id: str) -> dict:
    return require(db, "policies", policy_id, "policy")


def _reprice(db: Backend, policy_id: str) -> float:
    pol = db.get("policies", policy_id)
    n = len(db.select("vehicles", policy_id=policy_id))
    premium = round(PLAN_RATES[pol["plan"]] * max(n, 1), 2)
    db.update("policies", policy_id, premium_monthly=premium)
    return premium


@tools.tool("List a customer's policies.", mutates=False, customer_id=P("string", "Customer id"))
def list_policies(db: Backend, customer_id):
    return db.select("policies", customer_id=customer_id)


@tools.tool("Fetch a policy with its vehicles, drivers and claims.", mutates=False, policy_id=P("string", "Policy id"))
def get_policy(db: Backend, policy_id):
    pol = _policy(db, policy_id)
    return {**pol, "vehicles": db.select("vehicles", policy_id=policy_id), "drivers": db.select("drivers", policy_id=policy_id),
            "claims": [{k: c[k] for k in ("id", "type", "status", "incident_date")} for c in db.select("claims", policy_id=policy_id)]}


@tools.tool("Fetch one claim.", mutates=False, claim_id=P("string", "Claim id"))
def get_claim(db: Backend, claim_id):
    return require(db, "claims", claim_id, "claim")


@tools.tool("File a claim for a vehicle on a policy.",
            policy_id=P("string", "Policy id"), vehicle_id=P("string", "Vehicle id on that policy"),
            type=P("string", "Claim type", enum=CLAIM_TYPES), incident_date=P("string", "YYYY-MM-DD"),
            amount_claimed=P("number", "Estimated damage in USD", minimum=0),
            fast_track=P("boolean", "Whether the manual allows fast-track handling"),
            description=P("string", "What happened", max_length=2000))
def file_claim(db: Backend, policy_id, vehicle_id, type, incident_date, amount_claimed, fast_track, description):
    _policy(db, policy_id)
    veh = db.get("vehicles", vehicle_id)
    if veh is None or veh["policy_id"] != policy_id:
        raise ToolError(f"vehicle {vehicle_id} is not on policy {policy_id}")
    if incident_date > db.today:
        raise ToolError("incident_date is in the future")
    row = db.insert("claims", {"policy_id": policy_id, "vehicle_id": vehicle_id, "type": type, "status": "open",
                               "incident_date": incident_date, "amount_claimed": round(float(amount_claimed), 2),
                               "fast_track": fast_track, "description": description, "created_at": db.today})
    return {"claim_id": row["id"], "status": "open"}


@tools.tool("Add a vehicle to a policy; the premium is recalculated.",
            policy_id=P("string", "Policy id"), vin=P("string", "17-character VIN", max_length=17),
            make=P("string", "Make"), model=P("string", "Model"), year=P("integer", "Model year", minimum=1950),
            usage=P("string", "How the vehicle is used", enum=("personal", "commute", "business")))
def add_vehicle(db: Backend, policy_id, vin, make, model, year, usage):
    pol = _policy(db, policy_id)
    if pol["status"] != "active":
        raise ToolError(f"policy {policy_id} is {pol['status']}")
    if db.select("vehicles", vin=vin.upper()):
        raise ToolError(f"a vehicle with VIN {vin} is already insured")
    row = db.insert("vehicles", {"policy_id": policy_id, "vin": vin.upper(), "make": make, "model": model, "year": year, "usage": usage})
    return {"vehicle_id": row["id"], "premium_monthly": _reprice(db, policy_id)}


@tools.tool("Remove a vehicle from a policy; the premium is recalculated.",
            policy_id=P("string", "Policy id"), vehicle_id=P("string", "Vehicle id"))
def remove_vehicle(db: Backend, policy_id, vehicle_id):
    veh = db.get("vehicles", vehicle_id)
    if veh is None or veh["policy_id"] != policy_id:
        raise ToolError(f"vehicle {vehicle_id} is not on policy {policy_id}")
    if len(db.select("vehicles", policy_id=policy_id)) == 1:
        raise ToolError("a policy must keep at least one vehicle; cancel the policy instead")
    db.delete("vehicles", vehicle_id)
    return {"removed": vehicle_id, "premium_monthly": _reprice(db, policy_id)}


@tools.tool("Add a driver to a policy.", policy_id=P("string", "Policy id"), name=P("string", "Full name"),
            license_number=P("string", "Driver licence number", max_length=20), birth_date=P("string", "YYYY-MM-DD"))
def add_driver(db: Backend, policy_id, name, license_number, birth_date):
    pol = _policy(db, policy_id)
    if pol["status"] != "active":
        raise ToolError(f"policy {policy_id} is {pol['status']}")
    row = db.insert("drivers", {"policy_id": policy_id, "name": name, "license_number": license_number.upper(), "birth_date": birth_date})
    return {"driver_id": row["id"]}


@tools.tool("Change the deductible of a policy.", policy_id=P("string", "Policy id"),
            deductible=P("integer", "New deductible in USD", enum=(250, 500, 1000)))
def change_deductible(db: Backend, policy_id, deductible):
    _policy(db, policy_id)
    return db.update("policies", policy_id, deductible=deductible)


@tools.tool("Cancel a policy.", policy_id=P("string", "Policy id"),
            reason=P("string", "Reason code", enum=("sold_vehicle", "switched_insurer", "moving_abroad", "other")))
def cancel_policy(db: Backend, policy_id, reason):
    pol = _policy(db, policy_id)
    if pol["status"] != "active":
        raise ToolError(f"policy {policy_id} is already {pol['status']}")
    db.update("policies", policy_id, status="cancelled", end_date=db.today)
    return {"policy_id": policy_id, "status": "cancelled", "reason": reason}


@tools.tool("Refund premium to the policyholder.", policy_id=P("string", "Policy id"),
            amount=P("number", "Amount in USD", minimum=0.01), note=opt("string", "Internal note", max_length=500))
def refund_premium(db: Backend, policy_id, amount, note=""):
    pol = _policy(db, policy_id)
    if amount > pol["premium_monthly"] + 1e-9:
        raise ToolError("a premium refund cannot exceed one monthly premium")
    row = db.insert("payments", {"policy_id": policy_id, "amount": round(float(amount), 2), "kind": "refund", "note": note, "created_at": db.today})
    return {"payment_id": row["id"], "amount": row["amount"]}


DOMAIN = Domain("insurance", Path(__file__).parent, TABLES, tools)
