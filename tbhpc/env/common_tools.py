"""Toolsets every domain shares: ticketing, the policy-manual search and the human handoff.

Why shared: the reference benchmark gives every domain the same ticketing tools and a manual
search; agents trained on one domain should meet the same contract in the others.

The manual search is deterministic BM25 over an SQLite FTS5 index built once into the domain's
template image (no embedding server, no network). The FTS table is not a declared `Table`, so it
never enters the state hash.
"""
from __future__ import annotations

import re
import sqlite3

from tbhpc.env.db import Backend, Table, cols
from tbhpc.env.tools import ToolError, ToolRegistry, find_by_email, opt, P, require
from tbhpc.tasks.schema import ManualDoc

TICKET_STATUS = ("new", "open", "pending", "solved", "closed")
TICKET_PRIORITY = ("low", "normal", "high", "urgent")
TICKET_TYPE = ("question", "incident", "problem", "task")

TICKET_TABLES = (
    Table("tickets", cols("id requester_id subject description status priority type assignee_id tags created_at updated_at",
                          tags="json"),
          volatile=frozenset({"subject", "description", "created_at", "updated_at"}), id_prefix="TK"),
    Table("handoffs", cols("id customer_id reason summary created_at"),
          volatile=frozenset({"summary", "created_at"}), id_prefix="H"),
)

customer_lookup = ToolRegistry()


@customer_lookup.tool("Find a customer by email address.", mutates=False, email=P("string", "Email address"))
def find_customer_by_email(db: Backend, email):
    return find_by_email(db, db.meta["customer_table"], email, "customer")


tickets = ToolRegistry()


@tickets.tool(
    "Create a support ticket for a customer. Use the type and priority the policy manual prescribes.",
    requester_id=P("string", "Customer id of the requester"),
    subject=P("string", "One-line subject", max_length=200),
    description=P("string", "What happened and what is needed", max_length=4000),
    type=P("string", "Ticket type", enum=TICKET_TYPE),
    priority=P("string", "Ticket priority", enum=TICKET_PRIORITY),
    tags=opt("array", "Tags from the manual's tag list", items={"type": "string", "maxLength": 40}),
)
def create_ticket(db: Backend, requester_id, subject, description, type, priority, tags=None):
    if db.meta.get("customer_table") and db.get(db.meta["customer_table"], requester_id) is None:
        raise ToolError(f"requester {requester_id} not found")
    row = db.insert("tickets", {
        "requester_id": requester_id, "subject": subject, "description": description,
        "status": "new", "priority": priority, "type": type, "assignee_id": None,
        "tags": sorted(set(tags or [])), "created_at": db.today, "updated_at": db.today,
    })
    return {"ticket_id": row["id"], "status": row["status"]}


@tickets.tool("Fetch one ticket by id.", mutates=False, ticket_id=P("string", "Ticket id, e.g. TK3"))
def get_ticket(db: Backend, ticket_id):
    return require(db, "tickets", ticket_id, "ticket")


@tickets.tool(
    "Update a ticket's status, priority or assignee. Omitted fields stay as they are.",
    ticket_id=P("string", "Ticket id"),
    status=opt("string", "New status", enum=TICKET_STATUS),
    priority=opt("string", "New priority", enum=TICKET_PRIORITY),
    assignee_id=opt("string", "Agent or team id to assign"),
)
def update_ticket(db: Backend, ticket_id, **changes):
    row = require(db, "tickets", ticket_id, "ticket")
    if row["status"] == "closed":
        raise ToolError(f"ticket {ticket_id} is closed and cannot change")
    if not changes:
        raise ToolError("nothing to update")
    return db.update("tickets", ticket_id, updated_at=db.today, **changes)


@tickets.tool(
    "List tickets of a requester, optionally filtered by status.", mutates=False,
    requester_id=P("string", "Customer id"),
    status=opt("string", "Only tickets with this status", enum=TICKET_STATUS),
)
def search_tickets(db: Backend, requester_id, status=None):
    where = {"requester_id": requester_id} | ({"status": status} if status else {})
    return [{k: r[k] for k in ("id", "subject", "status", "priority", "type")} for r in db.select("tickets", **where)]


@tickets.tool(
    "Hand the conversation to a human agent. Ends your turn; use only when the manual says so.",
    end_turn=True,
    customer_id=P("string", "Customer id"),
    reason=P("string", "Handoff reason code from the manual", enum=("policy_exception", "fraud_suspected", "legal", "customer_request")),
    summary=P("string", "Short summary for the human agent", max_length=2000),
)
def transfer_to_human(db: Backend, customer_id, reason, summary):
    row = db.insert("handoffs", {"customer_id": customer_id, "reason": reason, "summary": summary, "created_at": db.today})
    return {"handoff_id": row["id"], "message": "A human agent will take over."}


# -- policy manual --------------------------------------------------------------------------

manual = ToolRegistry()
_WORD = re.compile(r"[A-Za-z0-9]+")


@manual.tool(
    "Search the policy manual. Returns the best-matching sections (BM25).", mutates=False,
    query=P("string", "What to look for, in plain words", max_length=500),
    max_results=opt("integer", "How many sections (1-10, default 3)", minimum=1),
)
def search_policy(db: Backend, query, max_results=3):
    words = _WORD.findall(query.lower())[:32]
    if not words:
        raise ToolError("query has no searchable words")
    match = " OR ".join(f'"{w}"' for w in words)  # quoted terms: FTS5 syntax cannot be injected
    rows = db.conn.execute(
        "SELECT doc, section, body FROM policy_manual WHERE policy_manual MATCH ? ORDER BY bm25(policy_manual), rowid LIMIT ?",
        (match, min(int(max_results), 10)),
    ).fetchall()
    return [{"document": d, "section": s, "text": b} for d, s, b in rows]


def manual_index_setup(docs: tuple[ManualDoc, ...]):
    """A template `setup` hook: index each `## section` of each document as one FTS5 row."""
    def setup(conn: sqlite3.Connection) -> None:
        conn.execute("CREATE VIRTUAL TABLE policy_manual USING fts5(doc, section, body, tokenize='porter')")
        for doc in docs:
            for section, body in split_sections(doc.text):
                conn.execute("INSERT INTO policy_manual (doc, section, body) VALUES (?, ?, ?)", (doc.name, section, body))
    return setup


def split_sections(text: str) -> list[tuple[str, str]]:
    out, title, buf = [], "Overview", []
    for line in text.splitlines():
        if line.startswith("## "):
            if "".join(buf).strip():
                out.append((title, "\n".join(buf).strip()))
            title, buf = line[3:].strip(), []
        else:
            buf.append(line)
    if "".join(buf).strip():
        out.append((title, "\n".join(buf).strip()))
    return out
