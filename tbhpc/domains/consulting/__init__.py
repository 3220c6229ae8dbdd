"""Consulting IT/HR helpdesk ("Brightline Consulting"): employees, devices, system access,
leave and expenses.

The manual governs approvals: who must approve which access level, when leave is auto-approved,
which expenses need a receipt or finance review, repair versus replacement of devices, and the
offboarding checklist.
"""
from __future__ import annotations

from pathlib import Path

from tbhpc.env.db import Backend, Table, cols
from tbhpc.env.domain import Domain
from tbhpc.env.tools import P, ToolError, ToolRegistry, find_by_email, require

SYSTEMS = ("github", "salesforce", "figma", "aws", "workday")

TABLES = (
    Table("employees", cols("id name email department title manager_id status leave_balance", leave_balance="int")),
    Table("devices", cols("id employee_id type model assigned_date status"), id_prefix="DV"),
    Table("access_grants", cols("id employee_id system level status approved_by"), id_prefix="AG"),
    Table("leave_requests", cols("id employee_id kind start_date days status created_at", days="int"),
          volatile=frozenset({"created_at"}), id_prefix="LR"),
    Table("expenses", cols("id employee_id category amount receipt status description", amount="real", receipt="bool"),
          volatile=frozenset({"description"}), id_prefix="EX"),
    Table("repairs", cols("id device_id issue status"), id_prefix="RP"),
)
# the shared ticketing tools check requesters against this table
CUSTOMER_TABLE = "employees"

tools = ToolRegistry()


def _employee(db: Backend, employee_id: str) -> dict:
    return require(db, "employees", employee_id, "employee")


@tools.tool("Find an employee by work email.", mutates=False, email=P("string", "Work email"))
def find_employee_by_email(db: Backend, email):
    return find_by_email(db, "employees", email, "employee")


@tools.tool("Fetch an employee's profile, including manager and leave balance.", mutates=False,
            employee_id=P("string", "Employee id"))
def get_employee(db: Backend, employee_id):
    return _employee(db, employee_id)


@tools.tool("List an employee's devices and access grants.", mutates=False, employee_id=P("string", "Employee id"))
def list_assets(db: Backend, employee_id):
    _employee(db, employee_id)
    return {"devices": db.select("devices", employee_id=employee_id), "access": db.select("access_grants", employee_id=employee_id)}


@tools.tool("Grant system access.", employee_id=P("string", "Employee id"), system=P("string", "System", enum=SYSTEMS),
            level=P("string", "Access level", enum=("read", "write")),
            approved_by=P("string", "Who approved: 'policy' for read access, else the approver's employee id"))
def grant_access(db: Backend, employee_id, system, level, approved_by):
    emp = _employee(db, employee_id)
    if emp["status"] != "active":
        raise ToolError(f"employee {employee_id} is {emp['status']}")
    if any(a["status"] == "active" and a["system"] == system for a in db.select("access_grants", employee_id=employee_id)):
        raise ToolError(f"{employee_id} already has active {system} access; revoke it first to change the level")
    row = db.insert("access_grants", {"employee_id": employee_id, "system": system, "level": level, "status": "active", "approved_by": approved_by})
    return {"grant_id": row["id"]}


@tools.tool("Revoke one access grant.", grant_id=P("string", "Grant id"))
def revoke_access(db: Backend, grant_id):
    g = require(db, "access_grants", grant_id, "grant")
    if g["status"] != "active":
        raise ToolError(f"grant {grant_id} is already {g['status']}")
    return db.update("access_grants", grant_id, status="revoked")


@tools.tool("Submit a leave request with the status the manual prescribes; approved vacation is deducted from the balance.",
            employee_id=P("string", "Employee id"), kind=P("string", "Leave kind", enum=("vacation", "sick")),
            start_date=P("string", "YYYY-MM-DD"), days=P("integer", "Working days", minimum=1),
            status=P("string", "Decision per the manual", enum=("approved", "pending")))
def submit_leave(db: Backend, employee_id, kind, start_date, days, status):
    emp = _employee(db, employee_id)
    if kind == "vacation" and start_date <= db.today:
        raise ToolError("vacation must start after today")
    row = db.insert("leave_requests", {"employee_id": employee_id, "kind": kind, "start_date": start_date, "days": days,
                                       "status": status, "created_at": db.today})
    if kind == "vacation" and status == "approved":
        if days > emp["leave_balance"]:
            raise ToolError(f"only {emp['leave_balance']} vacation days left")
        db.update("employees", employee_id, leave_balance=emp["leave_balance"] - days)
    return {"request_id": row["id"], "status": status}


@tools.tool("Submit an expense claim with the status the manual prescribes.", employee_id=P("string", "Employee id"),
            category=P("string", "Category", enum=("travel", "meals", "software", "training")),
            amount=P("number", "Amount in USD", minimum=0.01), receipt=P("boolean", "Whether a receipt is attached"),
            status=P("string", "Decision per the manual", enum=("approved", "finance_review")),
            description=P("string", "What it was for", max_length=500))
def submit_expense(db: Backend, employee_id, category, amount, receipt, status, description):
    _employee(db, employee_id)
    row = db.insert("expenses", {"employee_id": employee_id, "category": category, "amount": round(float(amount), 2),
                                 "receipt": receipt, "status": status, "description": description})
    return {"expense_id": row["id"], "status": status}


@tools.tool("Send a device to repair.", device_id=P("string", "Device id"),
            issue=P("string", "Issue code", enum=("screen", "battery", "keyboard", "wont_boot", "other")))
def request_repair(db: Backend, device_id, issue):
    dev = require(db, "devices", device_id, "device")
    if dev["status"] != "assigned":
        raise ToolError(f"device {device_id} is {dev['status']}")
    db.update("devices", device_id, status="in_repair")
    row = db.insert("repairs", {"device_id": device_id, "issue": issue, "status": "open"})
    return {"repair_id": row["id"]}


@tools.tool("Replace a device: the old one is marked returned and a new one of the same type is assigned.",
            device_id=P("string", "Device id"), model=P("string", "Model of the new device from the catalogue"))
def replace_device(db: Backend, device_id, model):
    dev = require(db, "devices", device_id, "device")
    if dev["status"] != "assigned":
        raise ToolError(f"device {device_id} is {dev['status']}")
    db.update("devices", device_id, status="returned")
    row = db.insert("devices", {"employee_id": dev["employee_id"], "type": dev["type"], "model": model, "assigned_date": db.today, "status": "assigned"})
    return {"new_device_id": row["id"]}


@tools.tool("Mark an employee as offboarding (after access is revoked).", employee_id=P("string", "Employee id"))
def start_offboarding(db: Backend, employee_id):
    emp = _employee(db, employee_id)
    if emp["status"] != "active":
        raise ToolError(f"employee {employee_id} is {emp['status']}")
    return db.update("employees", employee_id, status="offboarding")


DOMAIN = Domain("consulting", Path(__file__).parent, TABLES, tools, customer_table=CUSTOMER_TABLE)
