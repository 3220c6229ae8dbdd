"""The Getting started pages say what really happens: every command of a transcript block
(```text with `$ ` lines) runs here, in a fresh folder, and prints what the page shows (each shown
line, in order, among the lines printed; `...` in a shown line stands for any text). A block of
commands that cannot run in the suite says why, in a `<!-- not run in the suite: ... -->` comment
right above it."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGES = sorted((REPO / "docs" / "getting-started").glob("*.md"))
BLOCK = re.compile(r"(?:<!-- (not run in the suite: [^>]*?) -->\n)?```(\w*)\n(.*?)```", re.S)


def _blocks(page: Path):
    return [(m.group(1), m.group(2), m.group(3)) for m in BLOCK.finditer(page.read_text())]


def _transcript(text: str) -> list[tuple[str, list[str]]]:
    steps = []
    for line in text.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        elif steps:
            steps[-1][1].append(line)
    return steps


def _matches(shown: str, printed: str) -> bool:
    return re.fullmatch(".*?".join(re.escape(p) for p in shown.split("...")), printed.rstrip()) is not None


def test_every_block_of_commands_runs_or_says_why_not():
    for page in PAGES:
        for reason, lang, text in _blocks(page):
            if lang == "text" and _transcript(text):
                continue                                  # run below
            if lang in ("bash", "python", "sh", "console"):
                assert reason, f"{page.relative_to(REPO)}: a {lang} block neither runs in the suite nor says why"


@pytest.mark.parametrize("page", [p for p in PAGES if any(l == "text" and _transcript(t) for _, l, t in _blocks(p))],
                         ids=lambda p: p.name)
def test_transcripts_print_what_the_page_shows(page, tmp_path):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", "COLUMNS": "200"}
    for _, lang, text in _blocks(page):
        for command, shown in _transcript(text) if lang == "text" else []:
            out = subprocess.run(command, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
            assert out.returncode == 0, f"{command}: {out.stderr[-2000:]}"
            printed, at = out.stdout.splitlines(), 0
            for line in shown:
                found = next((i for i in range(at, len(printed)) if _matches(line, printed[i])), None)
                assert found is not None, f"{page.name}: `{command}` did not print {line!r}; it printed:\n{out.stdout}"
                at = found + 1
