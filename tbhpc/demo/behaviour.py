"""Did the model learn the tasks, or a fixed behaviour? Per task type (template), warm start vs
trained, and what each attempt *did* to the database.

A small model trained with RL can raise its score by collapsing onto one behaviour that happens
to pay on some task types (always refuse, always act). Each attempt is classified from its final
state alone: `kept` (the database is unchanged: refused, answered or transferred nothing) or
`changed` (it wrote something), and each task type by what its golden calls do. A type is
flagged when the trained model does one thing on (nearly) all of its attempts while the type's
tasks need the other and the warm start did not already (a type the model never learned to act on
is a gap of the warm start, shown but not flagged; a type with fewer than MIN_ATTEMPTS trained
attempts is shown but not flagged either), or when the trained model does the same thing on every type.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from tbhpc.env.golden import golden_state, initial_state
from tbhpc.env.state import state_hash

FIXED = 0.95        # share of a type's attempts doing one thing that counts as "always"
# Below 1 / (1 - FIXED) attempts, ">= 95%" can only mean "all of a handful", which a model that
# acts half the time does on 4 attempts one time in 16: such a type is noted, not flagged.
MIN_ATTEMPTS = round(1 / (1 - FIXED))


@dataclass
class TypeRow:
    template: str
    domain: str
    tasks: int
    golden: str                 # kept | changed | mixed: what the type's golden calls do
    warm: float                 # pass@1 of the warm start
    trained: float
    trained_changed: float      # share of the trained model's attempts that changed the database
    warm_changed: float = 0.0
    flag: str = ""              # a fixed behaviour that training brought in
    note: str = ""              # the same fixed behaviour, already the warm start's


def task_kinds(tasks) -> dict[str, tuple[str, str, str, str]]:
    """task id -> (template, domain, initial hash, golden hash), from fresh backends."""
    from tbhpc.domains import get_domain
    out = {}
    for t in tasks:
        d = get_domain(t.domain)
        out[t.id] = (t.template or t.id.rsplit("-", 1)[0], t.domain,
                     state_hash(initial_state(d, t)), golden_state(d, t)[1])
    return out


def type_table(kinds: dict, warm_rows: list[tuple], trained_rows: list[tuple]) -> list[TypeRow]:
    """Rows are (task_id, passed, final_hash) of clean attempts. Pure: no database access."""
    acc: dict[str, dict] = defaultdict(lambda: {"tasks": set(), "golden": set(), "w": [0, 0], "t": [0, 0], "ch": 0, "wch": 0,
                                                "dom": ""})
    for tid, (template, dom, init, gold) in kinds.items():   # a type is (domain, template): names repeat across domains
        a = acc[(dom, template)]
        a["dom"] = dom
    for side, rows in (("w", warm_rows), ("t", trained_rows)):
        for tid, passed, final in rows:
            template, dom, init, gold = kinds[tid]
            a = acc[(dom, template)]
            a["tasks"].add(tid)
            a["golden"].add("kept" if gold == init else "changed")
            a[side][0] += int(bool(passed))
            a[side][1] += 1
            a["ch" if side == "t" else "wch"] += int(final != init)
    out = []
    for (_, template), a in sorted(acc.items()):
        if not a["t"][1] or not a["w"][1]:
            continue
        golden = a["golden"].pop() if len(a["golden"]) == 1 else "mixed"
        changed, warm_changed = a["ch"] / a["t"][1], a["wch"] / a["w"][1]
        row = TypeRow(template, a["dom"], len(a["tasks"]), golden, a["w"][0] / a["w"][1], a["t"][0] / a["t"][1], changed,
                      warm_changed)
        if changed <= 1 - FIXED and golden != "kept":
            what, before = "always keeps the state (refuses) where the tasks need a change", warm_changed <= 1 - FIXED
        elif changed >= FIXED and golden == "kept":
            what, before = "always changes the state where the tasks need none", warm_changed >= FIXED
        else:
            what, before = "", False
        if before:
            row.note = what + " (so did the warm start)"
        elif what and a["t"][1] < MIN_ATTEMPTS:
            row.note = f"{what} (on {a['t'][1]} attempts: too few to tell)"
        else:
            row.flag = what
        out.append(row)
    return out


def global_collapse(rows: list[TypeRow]) -> str:
    """'' unless the trained model does one thing on every type (with both kinds present)."""
    if {r.golden for r in rows} >= {"kept", "changed"}:
        if all(r.trained_changed <= 1 - FIXED for r in rows):
            return "the trained model never changes the database on any task type"
        if all(r.trained_changed >= FIXED for r in rows):
            return "the trained model changes the database on every task type"
    return ""


def type_markdown(rows: list[TypeRow]) -> str:
    lines = ["| task type | domain | tasks | golden | warm start | trained | Δ | changed state: warm / trained | flag |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        flag = f"**{r.flag}**" if r.flag else (r.note or "-")
        lines.append(f"| {r.template} | {r.domain} | {r.tasks} | {r.golden} | {r.warm:.2f} | {r.trained:.2f} | "
                     f"{r.trained - r.warm:+.2f} | {r.warm_changed:.2f} / {r.trained_changed:.2f} | {flag} |")
    return "\n".join(lines)


def attempt_outcomes(run: Path) -> list[tuple]:
    """(task_id, passed, final_hash) of the clean attempts of a campaign run."""
    from tbhpc.store.merge import connect
    from tbhpc.store.run_dir import RunDir
    con = connect(RunDir(run), read_only=True)
    try:
        return con.execute("SELECT task_id, passed, final_hash FROM attempts WHERE status = 'ok' ORDER BY task_id, "
                           "attempt_index").fetchall()
    finally:
        con.close()
