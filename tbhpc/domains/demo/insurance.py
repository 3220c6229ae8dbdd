"""Demo insurance (Harbor Mutual, compact): a claim decided by the policy's status and limit, a
cancellation whose refund depends on how long the policy has run."""
from __future__ import annotations

from tbhpc.domains.demo import demo_domain, require_row
from tbhpc.domains.demo.cases import Case, act, call, refuse
from tbhpc.domains.gen import Gen
from tbhpc.env.db import Backend, Table, cols
from tbhpc.env.tools import P, ToolError, ToolRegistry

TABLES = (
    Table("policies", cols("id status limit days", limit="int", days="int")),
    Table("claims", cols("id policy_id amount", amount="int"), id_prefix="CL"),
    Table("cancellations", cols("id policy_id refund"), id_prefix="X"),
)
tools = ToolRegistry()


@tools.tool("Look up a policy.", mutates=False, policy_id=P("string", "Policy id"))
def get_policy(db: Backend, policy_id):
    p = require_row(db, "policies", policy_id, "policy")
    return {k: p[k] for k in ("status", "limit", "days")}


@tools.tool("File a claim.", policy_id=P("string", "Policy id"), amount=P("integer", "Claimed USD", minimum=1))
def file_claim(db: Backend, policy_id, amount):
    require_row(db, "policies", policy_id, "policy")     # a lapsed policy is refused by the rules, not by the tool
    return {"claim": db.insert("claims", {"policy_id": policy_id, "amount": amount})["id"]}


@tools.tool("Cancel a policy.", policy_id=P("string", "Policy id"),
            refund=P("string", "Refund kind", enum=("full", "prorated")))
def cancel_policy(db: Backend, policy_id, refund):
    p = require_row(db, "policies", policy_id, "policy")
    if p["status"] != "active":
        raise ToolError(f"policy {policy_id} is {p['status']}")
    db.update("policies", policy_id, status="cancelled")
    return {"cancellation": db.insert("cancellations", {"policy_id": policy_id, "refund": refund})["id"]}


DOMAIN = demo_domain("demo_insurance", TABLES, tools)


def _case(g: Gen, p: dict, query: str, goal: str, facts: dict, branches: dict, branch: str) -> Case:
    name, _ = g.person()
    return Case(query=query, persona=f"You are {name}, a Harbor Mutual customer. {goal}",
                facts={"policy id": p["id"], **facts}, patch={"policies": [p]},
                reads=(call("get_policy", policy_id=p["id"]),), ref=p["id"], branches=branches, branch=branch)


def claim(g: Gen) -> Case:
    branch = g.choice(["file", "transfer", "refuse"])
    limit = g.choice([500, 1000, 2000, 5000])
    amount = (g.randint(2, limit // 50) * 50 if branch != "transfer" else limit + g.randint(1, 20) * 50)
    p = {"id": f"HP{g.randint(1000, 9999)}", "status": "lapsed" if branch == "refuse" else "active",
         "limit": limit, "days": g.randint(20, 700)}
    query = g.choice(["I want to claim {a} USD on policy {p}.", "Please file a claim of {a} USD for policy {p}."]).format(a=amount, p=p["id"])
    return _case(g, p, query, "You want to file a claim.", {"claim amount": f"{amount} USD"}, {
        "file": act(call("file_claim", policy_id=p["id"], amount=amount), response="Your claim is filed."),
        "transfer": act(call("transfer", ref=p["id"]), response="A colleague will handle this claim."),
        "refuse": refuse("Does the message say the policy is not active?", ("not active",),
                         "Sorry, the policy is not active, so I cannot file a claim."),
    }, branch)


def cancel(g: Gen) -> Case:
    branch = g.choice(["full", "prorated"])
    days = g.randint(0, 14) if branch == "full" else g.randint(15, 40)
    p = {"id": f"HP{g.randint(1000, 9999)}", "status": "active", "limit": g.choice([500, 1000, 2000, 5000]), "days": days}
    query = g.choice(["Please cancel my policy {}.", "I want to cancel policy {}."]).format(p["id"])
    return _case(g, p, query, "You want the policy cancelled.", {}, {
        k: act(call("cancel_policy", policy_id=p["id"], refund=k), response=f"Your policy is cancelled with a {k} refund.")
        for k in ("full", "prorated")
    }, branch)


TEMPLATES = {"claim": claim, "cancel": cancel}
