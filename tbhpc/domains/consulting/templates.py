"""Consulting IT/HR task templates: each patches its own employee (and reports) into the org."""
from __future__ import annotations

from tbhpc.domains.gen import Draft, Gen

MANAGERS = {"engineering": "E1", "sales": "E2", "design": "E3", "finance": "E4"}
TITLES = {"engineering": "Software Engineer", "sales": "Account Executive", "design": "Product Designer", "finance": "Analyst"}
ISSUES = {"screen": "the screen flickers", "battery": "the battery dies in an hour", "keyboard": "several keys stopped working",
          "wont_boot": "it won't boot anymore"}


def _employee(g: Gen, dept: str | None = None, balance: int | None = None) -> dict:
    dept = dept or g.choice(sorted(MANAGERS))
    name, _ = g.person()
    first, last = name.lower().split()
    return {"id": g.new_id("E", 100), "name": name, "email": f"{first}.{last}{g.randint(1, 99)}@brightline.example",
            "department": dept, "title": TITLES[dept], "manager_id": MANAGERS[dept], "status": "active",
            "leave_balance": balance if balance is not None else g.randint(0, 25)}


def _draft(emp, patch, query, goal, facts, tags) -> Draft:
    d = Draft(query=query, persona=f"You are {emp['name']}, {emp['title']} at Brightline Consulting. {goal}",
              facts={"work email": emp["email"], **facts}, patch={"employees": [emp], **patch}, tags=tags)
    d.call("find_employee_by_email", email=emp["email"])
    return d


def access_request(g: Gen) -> Draft:
    emp = _employee(g)
    system = g.choice(["github", "salesforce", "figma", "aws", "aws", "workday"])
    level = g.choice(["read", "write", "write", "admin"])
    d = _draft(emp, {}, f"I need {level} access to {system}.", f"You need {level} access to {system} for a client project.",
               {"system": system, "access level": level}, ["access", "policy", level])
    d.call("search_policy", query=f"{level} access approval {system}")
    if level == "admin":
        d.call("create_ticket", requester_id=emp["id"], subject=f"Admin access to {system}", description="Admin access request",
               type="task", priority="high", tags=["admin_access_review"])
        d.response = "Admin access needs a security review; I opened a ticket for the security team."
    elif level == "write" and system == "aws" and emp["department"] != "engineering":
        d.decline("Does the message say aws write access is limited to engineering?", ("limited to engineering", "only engineering", "engineering department"),
                  "AWS write access is limited to the engineering department, so I can't grant it.", refusal=True)
    else:
        d.call("get_employee", employee_id=emp["id"])
        d.call("grant_access", employee_id=emp["id"], system=system, level=level,
               approved_by="policy" if level == "read" else emp["manager_id"])
        d.response = f"You now have {level} access to {system}."
    return d


def vacation(g: Gen) -> Draft:
    emp = _employee(g, balance=g.randint(3, 20))
    days = g.choice([g.randint(1, emp["leave_balance"]), emp["leave_balance"], emp["leave_balance"] + g.randint(1, 5)])
    start = g.days_ahead(g.randint(7, 90))
    d = _draft(emp, {}, f"I'd like to book {days} days of vacation starting {start}.", "You want to take vacation.",
               {"start date": start, "number of days": str(days)}, ["leave", "policy"])
    d.call("get_employee", employee_id=emp["id"]).call("search_policy", query="vacation approval leave balance")
    status = "approved" if days <= emp["leave_balance"] else "pending"
    d.call("submit_leave", employee_id=emp["id"], kind="vacation", start_date=start, days=days, status=status)
    d.response = f"Your vacation request is {status}."
    return d


def sick_leave(g: Gen) -> Draft:
    emp = _employee(g)
    days = g.choice([1, 2, 3, g.randint(4, 10)])
    start = g.days_ago(g.randint(0, 2))
    d = _draft(emp, {}, f"I'm sick and will be out {days} day{'s' if days > 1 else ''}.", "You are ill and need to record sick leave.",
               {"first sick day": start, "number of days": str(days)}, ["leave", "policy"])
    d.call("search_policy", query="sick leave approval")
    status = "approved" if days <= 3 else "pending"
    d.call("submit_leave", employee_id=emp["id"], kind="sick", start_date=start, days=days, status=status)
    d.response = f"Your sick leave is recorded ({status}). Get well soon."
    return d


def expense(g: Gen) -> Draft:
    emp = _employee(g)
    category = g.choice(["travel", "meals", "software", "training", "meals"])
    amount = g.choice([g.money(10, 75), 75.0, g.money(76, 1000), g.money(1001, 3000)])
    receipt = g.chance(0.75) or amount <= 75
    d = _draft(emp, {}, f"I need to submit a {category} expense of {amount:.2f} dollars.", f"You want your {category} expense reimbursed.",
               {"category": category, "amount": f"{amount:.2f}", "receipt attached": "yes" if receipt else "no, I lost it"},
               ["expense", "policy"])
    d.call("search_policy", query="expense receipt approval finance")
    if amount > 75 and not receipt:
        d.decline("Does the message ask the employee to attach a receipt?", ("receipt",),
                  "Expenses above 75 USD need a receipt; please attach one and submit again.", refusal=True)
    else:
        status = "finance_review" if category == "software" or amount > 1000 else "approved"
        d.call("submit_expense", employee_id=emp["id"], category=category, amount=amount, receipt=receipt, status=status,
               description=f"{category} expense")
        d.response = f"Your expense is submitted with status {status}."
    return d


def broken_device(g: Gen) -> Draft:
    emp = _employee(g)
    kind = g.choice(["laptop", "laptop", "phone", "monitor"])
    age = g.choice([g.randint(100, 1094), 1095, g.randint(1096, 1600)])
    dev = {"id": g.new_id("DV", 500), "employee_id": emp["id"], "type": kind,
           "model": {"laptop": "Brightbook 14 G3", "phone": "Pixelline 8", "monitor": "ViewPro 27"}[kind],
           "assigned_date": g.days_ago(age), "status": "assigned"}
    issue = g.choice(sorted(ISSUES)) if kind == "laptop" else "screen" if kind == "monitor" else g.choice(["screen", "battery"])
    d = _draft(emp, {"devices": [dev]}, f"My {kind} is broken: {ISSUES[issue]}.", f"Your {kind} is broken and you need it fixed.",
               {"device": kind, "problem": ISSUES[issue]}, ["device", "policy"])
    d.call("list_assets", employee_id=emp["id"]).call("search_policy", query="broken laptop repair replace")
    if kind == "laptop" and age >= 1095:
        d.call("replace_device", device_id=dev["id"], model="Brightbook 14 G5")
        d.response = "Your laptop is due for replacement; a Brightbook 14 G5 is assigned to you."
    else:
        d.call("request_repair", device_id=dev["id"], issue=issue)
        d.response = "Your device is booked in for repair."
    return d


def offboarding(g: Gen) -> Draft:
    dept = g.choice(sorted(MANAGERS))
    leaver = _employee(g, dept)
    systems = sorted(set(g.choice(["github", "salesforce", "figma", "aws", "workday"]) for _ in range(g.randint(1, 4))))
    grants = [{"id": g.new_id("AG", 700), "employee_id": leaver["id"], "system": s, "level": g.choice(["read", "write"]),
               "status": "active", "approved_by": "policy"} for s in systems]
    if g.chance(0.5):
        grants.append({"id": g.new_id("AG", 700), "employee_id": leaver["id"], "system": "workday" if "workday" not in systems else "figma",
                       "level": "read", "status": "revoked", "approved_by": "policy"})
    by_manager = g.chance(0.75)
    mgr_id = MANAGERS[dept]
    requester = {"E1": ("Morgan Lee", "morgan.lee@brightline.example"), "E2": ("Priya Raman", "priya.raman@brightline.example"),
                 "E3": ("Theo Marsh", "theo.marsh@brightline.example"), "E4": ("Lena Vogt", "lena.vogt@brightline.example")}
    req_id = mgr_id if by_manager else g.choice(sorted(set(MANAGERS.values()) - {mgr_id}))
    req_name, req_email = requester[req_id]
    d = Draft(query=f"{leaver['name']} is leaving the company on Friday. Please offboard them.",
              persona=f"You are {req_name}, a director at Brightline Consulting. You want an employee offboarded.",
              facts={"work email": req_email, "leaving employee": leaver["name"], "leaving employee email": leaver["email"]},
              patch={"employees": [leaver], "access_grants": grants}, tags=["offboarding", "policy"])
    d.call("find_employee_by_email", email=req_email).call("find_employee_by_email", email=leaver["email"])
    d.call("search_policy", query="offboarding employee checklist")
    if by_manager:
        d.call("list_assets", employee_id=leaver["id"])
        for gr in grants:
            if gr["status"] == "active":
                d.call("revoke_access", grant_id=gr["id"])
        d.call("start_offboarding", employee_id=leaver["id"])
        d.call("create_ticket", requester_id=req_id, subject=f"Collect devices of {leaver['name']}", description="Offboarding device collection",
               type="task", priority="normal", tags=["device_collection"])
        d.response = f"{leaver['name']}'s access is revoked, offboarding started, and IT will collect the devices."
    else:
        d.decline("Does the message say only the employee's manager can request offboarding?", ("only the manager", "their manager", "only their manager", "manager can request"),
                  "Only the employee's manager can request offboarding.", refusal=True)
    return d


def leave_balance(g: Gen) -> Draft:
    emp = _employee(g)
    d = _draft(emp, {}, "How many vacation days do I have left?", "You want to know your leave balance.", {}, ["read_only", "leave"])
    d.call("get_employee", employee_id=emp["id"])
    d.output_contains = [str(emp["leave_balance"])]
    d.response = f"You have {emp['leave_balance']} vacation days left."
    return d


TEMPLATES = {
    "access_request": (access_request, 22),
    "vacation": (vacation, 16),
    "sick_leave": (sick_leave, 12),
    "expense": (expense, 22),
    "broken_device": (broken_device, 18),
    "offboarding": (offboarding, 18),
    "leave_balance": (leave_balance, 12),
}
