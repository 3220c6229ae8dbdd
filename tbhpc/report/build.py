"""`tbhpc report RUN [--vs RUN2]`: Markdown + HTML + PNG plots in one folder.

The Markdown is made of the same pure renderers as `tbhpc agg --format md`; the HTML is that
Markdown's tables and images turned into plain HTML (no template engine, no network assets).
"""
from __future__ import annotations

import html
from pathlib import Path

from tbhpc.metrics import render
from tbhpc.metrics.agg import Counts, compare, summarise
from tbhpc.report import plots
from tbhpc.selection.bands import BAND_NAMES, assign


def build_report(counts: Counts, out: Path, kind: str, other: Counts | None = None, prices: dict | None = None,
                 bootstrap: int = 1000) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    summary = summarise(counts, prices, bootstrap)
    runs = [(_label(counts), counts)] + ([(_label(other), other)] if other else [])
    images = [plots.domain_bars(runs, out / "domains.png"), plots.k_curves(runs, out / "k_curves.png"),
              plots.rate_histogram(runs, out / "rates.png")]
    parts = [f"# Campaign report: {counts.campaign}", "", f"Run: `{counts.run}`", "", render.to_markdown(summary)]
    if other is not None:
        parts += [render.to_markdown(summarise(other, prices, bootstrap), title=f"{other.campaign} (comparison run)"),
                  render.comparison_markdown(compare(counts, other, bootstrap))]
    if kind == "probe":
        keep = counts.n > 0
        idx, _ = assign(counts.c[keep], counts.n[keep])
        bands = {b: int((idx == i).sum()) for i, b in enumerate(BAND_NAMES)}
        images.append(plots.band_bars(bands, out / "bands.png"))
        parts += ["## Difficulty bands (Jeffreys posterior argmax)", "", "| band | tasks |", "|---|---|"]
        parts += [f"| {b} | {n} |" for b, n in bands.items()] + [""]
    parts += ["## Plots", ""] + [f"![{p.stem}]({p.name})" for p in images]
    md = "\n".join(parts) + "\n"
    md_path, html_path = out / "report.md", out / "report.html"
    md_path.write_text(md, encoding="utf-8")
    from tbhpc.report.browser import write_browser
    write_browser(out, Path(counts.run) / "results.duckdb", _label(counts),
                  Path(other.run) / "results.duckdb" if other else None, _label(other) if other else None)
    link = ("<p><a href='failures.html'>Failure browser</a>: every task, sortable, with its attempts' transcripts "
            "and state diffs" + (" side by side" if other else "") + ".</p>")
    html_path.write_text(markdown_to_html(md, f"Campaign report: {counts.campaign}").replace("<body>\n", "<body>\n" + link, 1),
                         encoding="utf-8")
    return md_path, html_path


def _label(c: Counts) -> str:
    return f"{c.campaign} ({Path(c.run).name})"


def markdown_to_html(md: str, title: str) -> str:
    """Enough Markdown for our reports: headings, pipe tables, images, paragraphs, inline code."""
    body, table = [], []

    def flush_table():
        if not table:
            return
        rows = [r for r in table if not set(r.replace("|", "").strip()) <= {"-"}]
        cells = [[html.escape(c.strip()) for c in r.strip().strip("|").split("|")] for r in rows]
        body.append("<table><thead><tr>" + "".join(f"<th>{c}</th>" for c in cells[0]) + "</tr></thead><tbody>"
                    + "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in cells[1:]) + "</tbody></table>")
        table.clear()

    for line in md.splitlines():
        if line.startswith("|"):
            table.append(line)
            continue
        flush_table()
        if line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            body.append(f"<h{level}>{html.escape(line[level:].strip())}</h{level}>")
        elif line.startswith("!["):
            alt, src = line[2:].split("](", 1)
            body.append(f'<p><img alt="{html.escape(alt)}" src="{html.escape(src.rstrip(")"))}"></p>')
        elif line.strip():
            text = html.escape(line)
            parts = text.split("`")
            text = "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))
            body.append(f"<p>{text}</p>")
    flush_table()
    style = ("body{font-family:sans-serif;max-width:1100px;margin:2em auto}table{border-collapse:collapse;margin:1em 0}"
             "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}td:first-child,th:first-child{text-align:left}"
             "img{max-width:100%}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title><style>{style}</style>"
            f"</head><body>\n" + "\n".join(body) + "\n</body></html>\n")

