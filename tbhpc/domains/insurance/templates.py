"""Auto-insurance task templates (see the package docstring for what the manual governs)."""
from __future__ import annotations

from datetime import date

from tbhpc.domains.gen import Draft, Gen
from tbhpc.tasks.schema import Rubric

CARS = [("Toyota", "Corolla"), ("Ford", "F-150"), ("Subaru", "Outback"), ("Tesla", "Model 3"), ("Mazda", "CX-5"),
        ("Kia", "Soul"), ("Volkswagen", "Golf"), ("Hyundai", "Ioniq 5"), ("Honda", "Civic"), ("BMW", "X3")]
RATES = {"basic": 38.0, "standard": 55.0, "premium": 82.0}
REASONS = {"sold_vehicle": "I sold my car", "switched_insurer": "I found another insurer",
           "moving_abroad": "I'm moving abroad", "other": "I just don't need it"}


def _vin(g: Gen) -> str:
    alphabet = "ABCDEFGHJKLMNPRSTUVWXYZ0123456789"
    return "".join(g.choice(alphabet) for _ in range(17))


def _setup(g: Gen, plan: str | None = None, status: str = "active", started_days_ago: int | None = None, n_vehicles: int = 1):
    name, email = g.person()
    cust = {"id": g.new_id("C"), "name": name, "email": email, "phone": f"555-{g.randint(1000, 9999)}",
            "birth_date": f"{g.randint(1960, 2000)}-0{g.randint(1, 9)}-1{g.randint(0, 9)}"}
    plan = plan or g.choice(sorted(RATES))
    start = started_days_ago if started_days_ago is not None else g.randint(40, 300)
    pol = {"id": g.new_id("PL", 3000), "customer_id": cust["id"], "plan": plan, "status": status, "deductible": g.choice([250, 500, 1000]),
           "premium_monthly": RATES[plan] * n_vehicles, "start_date": g.days_ago(start), "end_date": g.days_ahead(365 - start)}
    vehicles = []
    for _ in range(n_vehicles):
        make, model = g.choice(CARS)
        vehicles.append({"id": g.new_id("V", 4000), "policy_id": pol["id"], "vin": _vin(g), "make": make, "model": model,
                         "year": g.randint(2008, 2025), "usage": g.choice(["personal", "commute"])})
    driver = {"id": g.new_id("D", 5000), "policy_id": pol["id"], "name": name, "license_number": f"L{g.randint(10**6, 10**7 - 1)}",
              "birth_date": cust["birth_date"]}
    return cust, pol, vehicles, driver


def _draft(cust, pol, vehicles, driver, query, goal, facts, tags, claims=()) -> Draft:
    patch = {"customers": [cust], "policies": [pol], "vehicles": vehicles, "drivers": [driver]}
    if claims:
        patch["claims"] = list(claims)
    d = Draft(query=query, persona=f"You are {cust['name']}, a Harbor Mutual policyholder. {goal}",
              facts={"email": cust["email"], **facts}, patch=patch, tags=tags)
    d.call("find_customer_by_email", email=cust["email"]).call("list_policies", customer_id=cust["id"])
    return d


def collision_claim(g: Gen) -> Draft:
    cust, pol, vehicles, driver = _setup(g)
    v = vehicles[0]
    days = g.choice([g.randint(0, 29), 30, g.randint(31, 60)])
    incident = g.days_ago(days)
    amount = float(g.randint(8, 90) * 100)
    ctype = g.choice(["collision", "weather"])
    what = "someone rear-ended me" if ctype == "collision" else "hail dented the roof"
    d = _draft(cust, pol, vehicles, driver, f"I need to file a claim, {what}.", "You want to file a claim for the damage.",
               {"vehicle": f"{v['make']} {v['model']}", "incident date": incident, "damage estimate": f"{amount:.0f} USD"},
               ["claim", "policy"])
    d.call("get_policy", policy_id=pol["id"]).call("search_policy", query="claim deadline days")
    if days <= 30:
        d.call("file_claim", policy_id=pol["id"], vehicle_id=v["id"], type=ctype, incident_date=incident,
               amount_claimed=amount, fast_track=False, description=what)
        d.response = "Your claim is filed and open; an adjuster will contact you."
    else:
        d.decline("Does the message say the 30-day claim deadline has passed?", ("30-day", "30 days", "deadline has passed"),
                  "I'm sorry, the 30-day claim deadline has passed, so I cannot file this claim.")
    return d


def glass_claim(g: Gen) -> Draft:
    cust, pol, vehicles, driver = _setup(g)
    v = vehicles[0]
    incident = g.days_ago(g.randint(0, 20))
    amount = float(g.choice([g.randint(2, 10) * 100, 1000, g.randint(11, 25) * 100]))
    d = _draft(cust, pol, vehicles, driver, "A rock cracked my windshield on the highway.", "You want the windshield claim filed.",
               {"vehicle": f"{v['make']} {v['model']}", "incident date": incident, "repair quote": f"{amount:.0f} USD"},
               ["claim", "glass", "policy"])
    d.call("get_policy", policy_id=pol["id"]).call("search_policy", query="glass claim fast track")
    d.call("file_claim", policy_id=pol["id"], vehicle_id=v["id"], type="glass", incident_date=incident,
           amount_claimed=amount, fast_track=amount <= 1000, description="windshield cracked by a rock")
    d.response = "Your glass claim is filed" + (" and fast-tracked." if amount <= 1000 else ".")
    return d


def theft_claim(g: Gen) -> Draft:
    cust, pol, vehicles, driver = _setup(g, n_vehicles=g.choice([1, 2]))
    v = vehicles[-1]
    incident = g.days_ago(g.randint(0, 10))
    amount = float(g.randint(50, 400) * 100)
    d = _draft(cust, pol, vehicles, driver, f"My {v['make']} was stolen from my driveway!", "Your car was stolen; you want to claim.",
               {"vehicle": f"{v['make']} {v['model']}", "date stolen": incident, "car value": f"{amount:.0f} USD"},
               ["claim", "theft", "policy"])
    d.call("get_policy", policy_id=pol["id"]).call("search_policy", query="theft claim")
    d.call("file_claim", policy_id=pol["id"], vehicle_id=v["id"], type="theft", incident_date=incident,
           amount_claimed=amount, fast_track=False, description="vehicle stolen from driveway")
    d.call("create_ticket", requester_id=cust["id"], subject=f"Theft claim on {pol['id']}", description="Vehicle stolen",
           type="incident", priority="urgent", tags=["theft_investigation"])
    d.response = "Your theft claim is filed and our investigations team has been notified."
    return d


def lapsed_claim_refused(g: Gen) -> Draft:
    cust, pol, vehicles, driver = _setup(g, status=g.choice(["cancelled", "lapsed"]))
    v = vehicles[0]
    d = _draft(cust, pol, vehicles, driver, "I had a fender bender yesterday, please open a claim.", "You want to claim for a small accident.",
               {"vehicle": f"{v['make']} {v['model']}", "incident date": g.days_ago(1), "damage estimate": "1200 USD"},
               ["claim", "policy", "refusal", "read_only"])
    d.call("get_policy", policy_id=pol["id"]).call("search_policy", query="claim policy not active")
    d.rubrics = [Rubric("Does the message tell the customer the policy is not active?", ("not active", "is cancelled", "has lapsed", "inactive"))]
    d.response = f"Your policy {pol['id']} is not active, so I cannot file a claim on it."
    return d


def add_vehicle(g: Gen) -> Draft:
    cust, pol, vehicles, driver = _setup(g)
    make, model = g.choice(CARS)
    vin, year = _vin(g), g.randint(2010, 2025)
    usage = g.choice(["personal", "commute", "business", "business"])
    d = _draft(cust, pol, vehicles, driver, f"I bought a {year} {make} {model}, please add it to my insurance.",
               f"You want your new car insured; you will use it for {usage}.",
               {"VIN": vin, "year": str(year), "make": make, "model": model, "usage": usage}, ["vehicle", "policy"])
    d.call("get_policy", policy_id=pol["id"]).call("search_policy", query="add vehicle business use")
    if usage != "business" or pol["plan"] == "premium":
        d.call("add_vehicle", policy_id=pol["id"], vin=vin, make=make, model=model, year=year, usage=usage)
        d.response = "The vehicle is added and your premium is updated."
    else:
        d.call("create_ticket", requester_id=cust["id"], subject="Commercial quote", description=f"Business use {make} {model}",
               type="task", priority="normal", tags=["commercial_quote"])
        d.response = "Business use needs the premium plan; our commercial team will send you a quote."
    return d


def add_driver(g: Gen) -> Draft:
    cust, pol, vehicles, driver = _setup(g)
    name = g.person()[0]
    age = g.choice([g.randint(17, 20), 21, g.randint(22, 60)])
    today = g.today
    birth = date(today.year - age, g.randint(1, 9), g.randint(1, 28))
    if birth > date(today.year - age, today.month, today.day):  # not had the birthday yet this year
        birth = date(birth.year, 1, 1)
    birth_s = birth.isoformat()
    lic = f"L{g.randint(10**6, 10**7 - 1)}"
    d = _draft(cust, pol, vehicles, driver, f"Can you add {name.split()[0]} as a driver on my policy?",
               f"You want {name} added as a driver.", {"driver name": name, "driver birth date": birth_s, "driver licence number": lic},
               ["driver", "policy"])
    d.call("get_policy", policy_id=pol["id"]).call("search_policy", query="add driver under 21")
    if age >= 21 or pol["plan"] != "basic":
        d.call("add_driver", policy_id=pol["id"], name=name, license_number=lic, birth_date=birth_s)
        d.response = f"{name} is now a driver on your policy."
    else:
        d.decline("Does the message say drivers under 21 need the standard or premium plan?", ("under 21",),
                  "Drivers under 21 require the standard or premium plan, so I can't add them to your basic plan.", refusal=True)
    return d


def deductible_change(g: Gen) -> Draft:
    cust, pol, vehicles, driver = _setup(g)
    new = g.choice([x for x in (250, 500, 1000) if x != pol["deductible"]])
    claims = []
    if g.chance(0.4):
        claims = [{"id": g.new_id("CL", 6000), "policy_id": pol["id"], "vehicle_id": vehicles[0]["id"], "type": "collision",
                   "status": "open", "incident_date": g.days_ago(g.randint(3, 25)), "amount_claimed": 1500.0,
                   "fast_track": False, "description": "earlier accident", "created_at": g.days_ago(2)}]
    d = _draft(cust, pol, vehicles, driver, f"I'd like my deductible changed to {new} dollars.", "You want a different deductible.",
               {"new deductible": str(new)}, ["deductible", "policy"], claims)
    d.call("get_policy", policy_id=pol["id"]).call("search_policy", query="deductible change open claim")
    if claims:
        d.decline("Does the message say an open claim must be settled first?", ("open claim",),
                  "Your policy has an open claim, which must be settled before the deductible can change.", refusal=True)
    else:
        d.call("change_deductible", policy_id=pol["id"], deductible=new)
        d.response = f"Your deductible is now {new} USD."
    return d


def cancel_policy(g: Gen) -> Draft:
    started = g.choice([g.randint(0, 14), 14, g.randint(15, 200)])
    cust, pol, vehicles, driver = _setup(g, started_days_ago=started)
    reason = g.choice(sorted(REASONS))
    d = _draft(cust, pol, vehicles, driver, "Please cancel my car insurance.", f"You want to cancel because {REASONS[reason]}.",
               {"reason": REASONS[reason]}, ["cancel", "policy"])
    d.call("get_policy", policy_id=pol["id"]).call("search_policy", query="cancel policy cooling-off refund")
    d.call("cancel_policy", policy_id=pol["id"], reason=reason)
    if started <= 14:
        d.call("refund_premium", policy_id=pol["id"], amount=pol["premium_monthly"])
        d.response = f"Your policy is cancelled and {pol['premium_monthly']:.2f} USD is refunded."
    else:
        d.response = "Your policy is cancelled. No refund is due."
    return d


def claim_status(g: Gen) -> Draft:
    cust, pol, vehicles, driver = _setup(g)
    status = g.choice(["open", "approved", "denied", "closed"])
    claim = {"id": g.new_id("CL", 6000), "policy_id": pol["id"], "vehicle_id": vehicles[0]["id"], "type": "collision",
             "status": status, "incident_date": g.days_ago(g.randint(10, 60)), "amount_claimed": 2100.0,
             "fast_track": False, "description": "parking lot damage", "created_at": g.days_ago(9)}
    d = _draft(cust, pol, vehicles, driver, f"What's happening with my claim {claim['id']}?", "You want the status of your claim.",
               {"claim id": claim["id"]}, ["read_only", "claim"], [claim])
    d.call("get_claim", claim_id=claim["id"])
    d.output_contains = [status]
    d.response = f"Your claim {claim['id']} is {status}."
    return d


def swap_vehicle(g: Gen) -> Draft:
    cust, pol, vehicles, driver = _setup(g, plan="standard", n_vehicles=2)
    old = vehicles[0]
    make, model = g.choice(CARS)
    vin, year = _vin(g), g.randint(2015, 2025)
    d = _draft(cust, pol, vehicles, driver, f"I sold my {old['make']} and bought a {make} {model}. Can you swap them on my policy?",
               "You replaced one car with another and want the policy updated.",
               {"sold car": f"{old['make']} {old['model']}", "VIN": vin, "year": str(year), "make": make, "model": model, "usage": "commute"},
               ["vehicle", "multi_intent"])
    d.call("get_policy", policy_id=pol["id"]).call("search_policy", query="add vehicle")
    d.call("remove_vehicle", policy_id=pol["id"], vehicle_id=old["id"])
    d.call("add_vehicle", policy_id=pol["id"], vin=vin, make=make, model=model, year=year, usage="commute")
    d.response = "Done: the old car is removed and the new one is insured."
    return d


TEMPLATES = {
    "collision_claim": (collision_claim, 16),
    "glass_claim": (glass_claim, 14),
    "theft_claim": (theft_claim, 10),
    "lapsed_claim_refused": (lapsed_claim_refused, 10),
    "add_vehicle": (add_vehicle, 16),
    "add_driver": (add_driver, 14),
    "deductible_change": (deductible_change, 14),
    "cancel_policy": (cancel_policy, 14),
    "claim_status": (claim_status, 10),
    "swap_vehicle": (swap_vehicle, 10),
}
