"""The demo pack's domains: the five businesses of the full pack in a compact form sized for the
~1M-parameter demo model on 2 CPU cores (`make demo`).

Why a second set of domains and not a smaller full pack: a full-pack episode is ~1,600 tokens
with ~13 real choices and a manual to search; a model of a million parameters trained for minutes
cannot assign credit over that, and 2 cores cannot buy the ~270 groups per step that would average
the noise out (docs/measurements/demo-history.md, "What GRPO did to the demo model"). Here the rules are stated in the system
prompt, each domain has at most six tools whose outputs are a handful of fields, and every task
turns on one decision read from a tool (a status, a tier, a number of days, an amount against a
limit). Same engine: tables, tools, backends, golden replay and grading are the full pack's.

A domain module holds its tables, tools and templates; its scenario is `<name>.yaml` beside it.
"""
from __future__ import annotations

import importlib
from pathlib import Path

from tbhpc.env.db import Backend, Table, cols
from tbhpc.env.domain import Domain
from tbhpc.env.tools import P, ToolError, ToolRegistry

from tbhpc.domains import DEMO_DOMAIN_NAMES  # noqa: F401  (one list of names, in tbhpc.domains)
HERE = Path(__file__).parent

# Every demo domain has the same handoff: the "always transfer" behaviour the pack is checked against.
HANDOFFS = Table("transfers", cols("id ref"), id_prefix="H")   # not the full domains' `handoffs`: every domain has that table too
handoff = ToolRegistry()


@handoff.tool("Hand the customer to a human agent.", end_turn=True, ref=P("string", "The id the request is about"))
def transfer(db: Backend, ref):
    row = db.insert("transfers", {"ref": ref})
    return {"handoff": row["id"]}


def require_row(db: Backend, table: str, row_id: str, what: str) -> dict:
    row = db.get(table, row_id)
    if row is None:
        raise ToolError(f"{what} {row_id} not found")
    return row


def demo_domain(name: str, tables: tuple[Table, ...], tools: ToolRegistry) -> Domain:
    """A compact domain: no seed rows (every task patches in its own), scenario `<short>.yaml`."""
    return Domain(name, HERE, tables + (HANDOFFS,), tools.merged(handoff), customer_table="",
                  scenario_file=f"{name.removeprefix('demo_')}.yaml", seed_file=None)


def module(name: str):
    return importlib.import_module(f"tbhpc.domains.demo.{name.removeprefix('demo_')}")
