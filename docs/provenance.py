"""Every table on a Measurements page says on the line above it when it was measured, on which
machine and with which command (docs/measurements/index.md gives the form), so that a reader can
judge a figure's age and re-measure it. The build hook (docs/hooks.py) turns each breach into a
warning, which `mkdocs build --strict` makes an error."""
from __future__ import annotations

import datetime
import re

LINE = re.compile(r"^\*(Measured|Computed) (\d{4}-\d\d-\d\d)(?: to (\d{4}-\d\d-\d\d))? · (dev VM|local cluster)[^·]* · `[^`]+`.*\*$")
EXEMPT = "<!-- not measured:"        # e.g. a table of pages or machines: `<!-- not measured: a list of pages -->`


def measurement_pages(nav: list) -> set[str]:
    """The pages under the nav's "Measurements" section (paths relative to docs/)."""
    def flatten(entry) -> list[str]:
        if isinstance(entry, str):
            return [entry]
        if isinstance(entry, list):
            return [p for e in entry for p in flatten(e)]
        return [p for v in entry.values() for p in flatten(v)]
    return {p for item in nav or [] if isinstance(item, dict) for k, v in item.items() if k == "Measurements"
            for p in flatten(v)}


def _date_problem(line: str, today: datetime.date) -> str | None:
    m = LINE.match(line)
    try:
        start = datetime.date.fromisoformat(m.group(2))
        end = datetime.date.fromisoformat(m.group(3)) if m.group(3) else start
    except ValueError as e:
        return f"bad date ({e})"
    if not start <= end <= today:
        return f"dates out of order or in the future ({start} to {end})"
    return None


def provenance_problems(markdown: str, today: datetime.date | None = None) -> list[str]:
    """One message per table without exactly one well-formed provenance line between it and the
    previous table or heading."""
    today = today or datetime.date.today()
    problems: list[str] = []
    candidates: list[tuple[int, str]] = []
    fenced = False
    previous = ""
    last_text = ""
    for number, line in enumerate(markdown.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if fenced:
            continue
        if line.startswith("#"):
            candidates, last_text = [], ""
        elif line.startswith("|") and not previous.startswith("|"):
            if not last_text.startswith(EXEMPT):
                if len(candidates) != 1:
                    problems.append(f"line {number}: a table needs one 'Measured|Computed DATE · MACHINE · `COMMAND`' "
                                    f"line above it, found {len(candidates)}")
                else:
                    at, text = candidates[0]
                    if not LINE.match(text):
                        problems.append(f"line {at}: provenance line not in the form "
                                        f"'*Measured YYYY-MM-DD · dev VM|local cluster... · `command`*'")
                    elif (why := _date_problem(text, today)):
                        problems.append(f"line {at}: {why}")
            candidates, last_text = [], ""
        elif line.startswith(("*Measured", "*Computed")):
            candidates.append((number, line))
        if line.strip() and not line.startswith("|"):
            last_text = line.strip()
        previous = line
    return problems
