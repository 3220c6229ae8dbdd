"""The report's failure browser: every task, sortable, each linking to its attempts' transcripts.

Why static HTML (no server, no network assets): a report folder is copied off a cluster and
opened from disk. `failures.html` lists the tasks (pass rate, domain, k/n; under `--vs` both runs
and the difference) and sorts by any column with a few lines of inline JavaScript; each task
page shows its attempts (base and comparison side by side), and each attempt's transcript,
state diff and rubric verdicts. The renderers are pure functions of plain data.
"""
from __future__ import annotations

import hashlib
import html
import json
import re
from pathlib import Path
from typing import Any

from tbhpc.store.health import open_results

_CSS = """body{font-family:system-ui,sans-serif;margin:1.5em;max-width:110em}table{border-collapse:collapse}
td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left}th{cursor:pointer;background:#f3f3f3}
.cols{display:flex;gap:1.5em}.col{flex:1;min-width:0}.msg{border-left:4px solid #ccc;margin:.3em 0;padding:.2em .6em;
white-space:pre-wrap;word-break:break-word;font-family:ui-monospace,monospace;font-size:.85em}
.user{border-color:#3b82f6}.assistant{border-color:#10b981}.tool{border-color:#f59e0b}.system{border-color:#9ca3af}
.call{color:#065f46}.fail{color:#b91c1c}.pass{color:#047857}.diff{color:#b91c1c;font-family:ui-monospace,monospace}"""
_SORT_JS = """function sortBy(th){const t=th.closest('table'),i=[...th.parentNode.children].indexOf(th),
b=t.tBodies[0],asc=th.dataset.asc!=='1';th.dataset.asc=asc?'1':'0';const rows=[...b.rows];
rows.sort((x,y)=>{const a=x.cells[i].dataset.v??x.cells[i].textContent,c=y.cells[i].dataset.v??y.cells[i].textContent;
const na=parseFloat(a),nc=parseFloat(c);const r=(!isNaN(na)&&!isNaN(nc))?na-nc:a.localeCompare(c);return asc?r:-r});
rows.forEach(r=>b.appendChild(r));}"""


def page_name(task_id: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", task_id)[:80]
    return f"{safe}-{hashlib.sha256(task_id.encode()).hexdigest()[:6]}.html"


def load_attempts(db: Path, with_transcripts: bool = True) -> dict[str, list[dict]]:
    """task_id -> attempt rows (ordered by index), transcripts expanded."""
    from tbhpc.store.transcripts import expand
    con = open_results(db, read_only=True)
    try:
        cols = ("task_id, domain, attempt_index, status, reward, passed, finish_reason, error, error_kind, diff, "
                "final_hash, golden_hash" + (", transcript" if with_transcripts else ""))
        cur = con.execute(f"SELECT {cols} FROM attempts ORDER BY task_id, attempt_index")
        names = [d[0] for d in cur.description]
        rows = [dict(zip(names, r)) for r in cur.fetchall()]
        blobs = dict(con.execute("SELECT ref, content FROM blobs").fetchall()) if with_transcripts and _has(con, "blobs") else {}
    finally:
        con.close()
    out: dict[str, list[dict]] = {}
    for r in rows:
        text = r.pop("transcript", None)
        r["transcript"] = expand(text, blobs.get) if text else None
        out.setdefault(r["task_id"], []).append(r)
    return out


def _has(con, table: str) -> bool:
    return bool(con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = ?", [table]).fetchone()[0])


def task_rows(base: dict[str, list[dict]], other: dict[str, list[dict]] | None) -> list[dict]:
    out = []
    for tid in sorted(set(base) | set(other or {})):
        row: dict[str, Any] = {"task_id": tid, "domain": (base.get(tid) or (other or {}).get(tid))[0]["domain"]}
        for side, data in (("base", base), ("other", other)):
            if data is None:
                continue
            clean = [a for a in data.get(tid, []) if a["status"] == "ok"]
            row[side] = (sum(bool(a["passed"]) for a in clean), len(clean))
        out.append(row)
    return out


def render_index(title: str, rows: list[dict], labels: tuple[str, str | None]) -> str:
    base_label, other_label = labels
    head = ["task", "domain", f"{base_label}: passed / clean", f"{base_label}: pass rate"]
    if other_label:
        head += [f"{other_label}: passed / clean", f"{other_label}: pass rate", "difference"]
    lines = ["<table id='tasks'><thead><tr>" + "".join(f"<th onclick='sortBy(this)'>{html.escape(h)}</th>" for h in head)
             + "</tr></thead><tbody>"]
    for r in rows:
        cells = [f"<td><a href='tasks/{page_name(r['task_id'])}'>{html.escape(r['task_id'])}</a></td>",
                 f"<td>{html.escape(str(r['domain']))}</td>"]
        rates = []
        for side in ("base", "other") if other_label else ("base",):
            c, n = r.get(side, (0, 0))
            rate = c / n if n else float("nan")
            rates.append(rate)
            cells += [f"<td data-v='{c}'>{c} / {n}</td>", f"<td data-v='{rate:.4f}'>{_pct(rate)}</td>"]
        if other_label:
            d = rates[1] - rates[0]
            cells.append(f"<td data-v='{d:.4f}'>{d * 100:+.1f} pts</td>" if d == d else "<td data-v='0'>-</td>")
        lines.append("<tr>" + "".join(cells) + "</tr>")
    lines.append("</tbody></table>")
    intro = (f"<p>{len(rows)} tasks. Click a column to sort; a task opens its attempts and transcripts. "
             f"Sorted by {html.escape(base_label)} pass rate, lowest first.</p>")
    rows_sorted_note = "<script>sortBy(document.querySelectorAll('#tasks th')[3]);</script>"
    return _page(title, f"<h1>{html.escape(title)}</h1>" + intro + "\n".join(lines) + rows_sorted_note)


def render_task(task_id: str, sides: list[tuple[str, list[dict]]]) -> str:
    cols = []
    for label, attempts in sides:
        parts = [f"<h2>{html.escape(label)}</h2>",
                 "<p>" + " ".join(f"<a href='#{_anchor(label, a)}' class='{_cls(a)}'>#{a['attempt_index']}</a>"
                                  for a in attempts) + "</p>"]
        for a in attempts:
            parts.append(render_attempt(label, a))
        cols.append("<div class='col'>" + "\n".join(parts) + "</div>")
    body = (f"<p><a href='../failures.html'>all tasks</a></p><h1>{html.escape(task_id)}</h1>"
            f"<div class='cols'>{''.join(cols)}</div>")
    return _page(task_id, body)


def render_attempt(label: str, a: dict) -> str:
    verdict = ("passed" if a["passed"] else "failed") if a["status"] == "ok" else "system error"
    out = [f"<details id='{_anchor(label, a)}' {'open' if not a['passed'] else ''}><summary class='{_cls(a)}'>"
           f"attempt {a['attempt_index']}: {verdict}, finish {html.escape(str(a['finish_reason']))}, "
           f"reward {a['reward']}</summary>"]
    if a.get("error"):
        out.append(f"<p class='fail'>{html.escape(str(a.get('error_kind') or 'error'))}: {html.escape(str(a['error']))}</p>")
    tr = a.get("transcript")
    if tr is None:
        out.append("<p>(no transcript stored for this attempt)</p>")
    else:
        for m in tr["messages"]:
            out.append(_message_html(m))
    diff = json.loads(a["diff"]) if isinstance(a.get("diff"), str) else (a.get("diff") or [])
    if diff:
        out.append("<p><b>state diff against the golden state</b></p>" +
                   "".join(f"<div class='diff'>{html.escape(str(d))}</div>" for d in diff))
    elif a.get("final_hash"):
        out.append("<p class='pass'>final state matches the golden state</p>")
    for r in (tr or {}).get("judge") or []:
        out.append(f"<p class='{'pass' if r.get('yes') else 'fail'}'>rubric {'YES' if r.get('yes') else 'NO'}: "
                   f"{html.escape(str(r.get('question')))}</p>")
    out.append("</details>")
    return "\n".join(out)


def _message_html(m: dict) -> str:
    role = str(m.get("role", "?"))
    if role == "system":
        return (f"<details class='msg system'><summary>system prompt ({len(m.get('content') or '')} characters)"
                f"</summary>{html.escape(str(m.get('content') or ''))}</details>")
    head = f"<b>{html.escape(role)}{' ' + html.escape(str(m['name'])) if role == 'tool' and m.get('name') else ''}</b>"
    parts = []
    if m.get("reasoning"):
        parts.append(f"<i>{html.escape(str(m['reasoning']))}</i>")
    if m.get("content"):
        parts.append(html.escape(str(m["content"])))
    for c in m.get("tool_calls") or []:
        fn = c.get("function", {})
        parts.append(f"<span class='call'>→ {html.escape(str(fn.get('name')))}({html.escape(str(fn.get('arguments')))})</span>")
    return f"<div class='msg {html.escape(role)}'>{head}\n" + "\n".join(parts) + "</div>"


def write_browser(out: Path, base_db: Path, base_label: str, other_db: Path | None = None,
                  other_label: str | None = None) -> Path:
    """failures.html + tasks/*.html in `out`; returns the index path."""
    base = load_attempts(base_db)
    other = load_attempts(other_db) if other_db is not None else None
    rows = task_rows(base, other)
    (out / "tasks").mkdir(parents=True, exist_ok=True)
    for r in rows:
        sides = [(base_label, base.get(r["task_id"], []))] + ([(other_label, other.get(r["task_id"], []))] if other else [])
        (out / "tasks" / page_name(r["task_id"])).write_text(render_task(r["task_id"], sides), encoding="utf-8")
    index = out / "failures.html"
    index.write_text(render_index("Tasks and their attempts", rows, (base_label, other_label)), encoding="utf-8")
    return index


def _anchor(label: str, a: dict) -> str:
    return f"{re.sub(r'[^A-Za-z0-9]', '', label)[:20]}-{a['attempt_index']}"


def _cls(a: dict) -> str:
    return "pass" if a.get("passed") else "fail"


def _pct(x: float) -> str:
    return "-" if x != x else f"{x * 100:.1f}%"


def _page(title: str, body: str) -> str:
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{_CSS}</style><script>{_SORT_JS}</script></head><body>\n{body}\n</body></html>\n")
