"""The site's build hook (mkdocs `hooks:`): a page that holds `<!-- tbhpc:cli -->`,
`<!-- tbhpc:configs -->` or `<!-- tbhpc:policies -->` gets that reference generated from the code at
build time (docs/reference.py), so the Reference pages can never disagree with the parsers and
dataclasses they describe; a table on a Measurements page without its date, machine and command
(docs/provenance.py) is a warning, which `--strict` makes a failed build; and the home page's
pipeline picture, `pipeline.svg`, is drawn from its source (docs/pipeline_diagram.py) at every build."""
from __future__ import annotations

import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pipeline_diagram  # noqa: E402  (docs/pipeline_diagram.py, beside this file)
import provenance  # noqa: E402  (docs/provenance.py, beside this file)
import reference  # noqa: E402  (docs/reference.py, beside this file)

log = logging.getLogger("mkdocs.hooks.tbhpc")

MARKERS = {"<!-- tbhpc:cli -->": reference.cli_markdown, "<!-- tbhpc:configs -->": reference.config_markdown,
           "<!-- tbhpc:policies -->": reference.policy_markdown}


def on_files(files, config):
    from mkdocs.structure.files import File
    files.append(File.generated(config, "pipeline.svg", content=pipeline_diagram.render_svg()))
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    for marker, render in MARKERS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, render())
    if page.file.src_uri in provenance.measurement_pages(config["nav"]):
        for problem in provenance.provenance_problems(markdown):
            log.warning("%s: %s", page.file.src_uri, problem)
    return markdown
