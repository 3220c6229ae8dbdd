"""The site's build hook (mkdocs `hooks:`): a page that holds `<!-- tbhpc:cli -->` or
`<!-- tbhpc:configs -->` gets the reference generated from the code at build time (docs/reference.py),
so the Reference pages can never disagree with the parsers and dataclasses they describe."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import reference  # noqa: E402  (docs/reference.py, beside this file)

MARKERS = {"<!-- tbhpc:cli -->": reference.cli_markdown, "<!-- tbhpc:configs -->": reference.config_markdown}


def on_page_markdown(markdown: str, page, config, files) -> str:
    for marker, render in MARKERS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, render())
    return markdown
