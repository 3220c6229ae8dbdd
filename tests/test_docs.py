"""The documentation site cannot rot silently: it builds strictly (a broken link or anchor fails),
its Reference pages come from the parsers and dataclasses (every command, every field), and no
page or module points outside the repository."""
import dataclasses
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}


def _build(root: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)], cwd=root,
                          capture_output=True, text=True, timeout=300, env=ENV)


def test_the_site_builds_strictly_with_every_command_and_field(tmp_path):
    out = _build(REPO, tmp_path / "site")
    assert out.returncode == 0, out.stderr[-3000:]
    from tbhpc.cli.main import build_parser
    from tbhpc.train.config import TrainConfig
    cli = (tmp_path / "site" / "reference" / "cli.html").read_text()
    sub = next(a for a in build_parser()._actions if a.dest == "cmd")
    assert [n for n in sub.choices if f"tbhpc {n}</code>" not in cli] == []
    config = (tmp_path / "site" / "reference" / "config.html").read_text()
    assert [f.name for f in dataclasses.fields(TrainConfig) if f"<code>{f.name}</code>" not in config] == []


def test_a_broken_link_or_anchor_fails_the_build(tmp_path):
    for name in ("mkdocs.yml", "docs"):
        (shutil.copytree if name == "docs" else shutil.copy)(REPO / name, tmp_path / name)
    page = tmp_path / "docs" / "getting-started" / "install.md"
    text = page.read_text()
    page.write_text(text + "\nSee [nowhere](no-such-page.md).\n")
    bad = _build(tmp_path, tmp_path / "site")
    assert bad.returncode != 0 and "no-such-page.md" in bad.stderr
    page.write_text(text + "\nSee [the demo](demo.md#no-such-anchor).\n")
    bad = _build(tmp_path, tmp_path / "site")
    assert bad.returncode != 0 and "no-such-anchor" in bad.stderr
    page.write_text(text)
    measured = tmp_path / "docs" / "measurements" / "results-store.md"
    measured.write_text(measured.read_text() + "\n## Planted\n\nA figure nobody can date:\n\n| a | b |\n|---|---|\n| 1 | 2 |\n")
    bad = _build(tmp_path, tmp_path / "site")
    assert bad.returncode != 0 and "measurements/results-store.md: line" in bad.stderr, bad.stderr[-2000:]


def _provenance():
    sys.path.insert(0, str(REPO / "docs"))
    import provenance
    return provenance


def test_every_measured_table_says_when_where_and_how():
    """Each table on a Measurements page has its date, machine and command on the line above it."""
    import yaml
    provenance = _provenance()
    pages = provenance.measurement_pages(yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"])
    assert {"measurements/results-store.md", "measurements/training.md", "demo.md"} <= pages
    problems = {p: provenance.provenance_problems((REPO / "docs" / p).read_text()) for p in sorted(pages)}
    assert {p: v for p, v in problems.items() if v} == {}
    tables = sum(len(re.findall(r"^(?!\|).*\n\n?\|", (REPO / "docs" / p).read_text(), re.M)) for p in pages)
    assert tables >= 30, tables


def test_the_provenance_check_finds_each_kind_of_gap():
    import datetime
    check = _provenance().provenance_problems
    today = datetime.date(2026, 12, 6)
    table = "| a | b |\n|---|---|\n| 1 | 2 |\n"
    good = "*Measured 2026-12-02 · dev VM: Intel Xeon · `python bench/x.py` (in `make bench`)*\n\n"
    assert check("# T\n\n" + good + table, today) == []
    assert check("# T\n\n*Computed 2026-12-01 to 2026-12-03 · local cluster · `tbhpc plan x.yaml`*\n" + table, today) == []
    assert check("# T\n\n<!-- not measured: a list -->\n" + table, today) == []
    assert check("```\n" + table + "```\n", today) == []
    assert len(check("# T\n\nsome text\n\n" + table, today)) == 1                       # no line at all
    assert len(check(good + "## next\n\n" + table, today)) == 1                            # a heading between
    assert len(check(good + table + "\n" + table, today)) == 1                               # one line, two tables
    assert len(check(good + good + table, today)) == 1                                      # two lines, one table
    assert "not in the form" in check("*Measured 2026-12-02 on this machine*\n" + table, today)[0]
    assert "not in the form" in check("*Measured 2026-12-02 · laptop · `x`*\n" + table, today)[0]
    assert "future" in check(good.replace("2026-12-02", "2027-01-01") + table, today)[0]
    assert "bad date" in check(good.replace("2026-12-02", "2026-13-02") + table, today)[0]
    assert "out of order" in check("*Measured 2026-12-03 to 2026-12-01 · dev VM · `x`*\n" + table, today)[0]


def test_module_docstrings_say_why_not_history():
    """A module's docstring states its job and its reasons; its history (issues, dated figures)
    belongs to the Measurements pages and the changelog. Packages are packages (not "rooms")."""
    import ast
    history = re.compile(r"\bissue \d+|\b20\d\d-\d\d-\d\d\b|\brooms?\b", re.I)
    found = {}
    for path in sorted((REPO / "tbhpc").rglob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text()))
        if not doc:
            found[str(path.relative_to(REPO))] = "no module docstring"
        elif (m := history.search(doc)):
            found[str(path.relative_to(REPO))] = m.group(0)
    assert found == {}


def test_the_layout_names_every_package_and_module():
    """Where things live: every package and top-level module of tbhpc/ has its line."""
    layout = (REPO / "docs" / "reference" / "layout.md").read_text()
    root = REPO / "tbhpc"
    names = [f"tbhpc/{p.name}/" for p in root.iterdir() if (p / "__init__.py").exists()]
    names += [f"`{p.name}`" for p in root.glob("*.py") if p.name != "__init__.py"]
    assert [n for n in sorted(names) if n not in layout and n.replace("`", "`tbhpc/", 1) not in layout] == []


def test_nothing_points_outside_the_repository():
    files = [REPO / "README.md", *(REPO / "docs").rglob("*.md"), *(REPO / "tbhpc").rglob("*.py")]
    outside = [f"{p.relative_to(REPO)}: {m}" for p in files for m in re.findall(r"\.\./shared\S*", p.read_text())]
    assert outside == []


def test_the_home_page_and_a_guide_render_without_console_errors(tmp_path, browser):
    """The built site in headless Chromium over HTTP: the home page and a guide load their theme,
    scripts and search index with no console error (no font or script fetched from the internet),
    nothing scrolls sideways, and the home page's pipeline is the picture the build drew."""
    import functools
    import threading
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
    from selenium.webdriver.common.by import By
    assert _build(REPO, tmp_path / "site").returncode == 0
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(tmp_path / "site"))
    handler.log_message = lambda *a: None
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        for page, heading in (("index.html", "tbhpc"), ("guides/campaigns.html", "Campaigns and the results SQL")):
            browser.get_log("browser")                     # drop what earlier pages logged
            browser.get(f"http://127.0.0.1:{server.server_address[1]}/{page}")
            assert browser.find_element(By.TAG_NAME, "h1").text.strip() == heading
            assert browser.find_elements(By.CSS_SELECTOR, "nav.md-nav"), page          # the theme's navigation rendered
            errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
            assert errors == [], (page, errors)
            # nothing scrolls sideways (the pipeline was ASCII art that did)
            assert browser.execute_script("return document.documentElement.scrollWidth <= window.innerWidth"), page
        # the home page's pipeline is a picture the build drew (docs/pipeline_diagram.py), shown at the page's width
        browser.get(f"http://127.0.0.1:{server.server_address[1]}/index.html")
        img = browser.find_element(By.CSS_SELECTOR, "img[src$='pipeline.svg']")
        shown = browser.execute_script("const i = arguments[0]; return [i.complete, i.naturalWidth, "
                                       "i.getBoundingClientRect().width, i.closest('article').clientWidth]", img)
        assert shown[0] and shown[1] > 500 and 0.9 * shown[3] <= shown[2] <= shown[3] + 1, shown
        assert "probe" in img.get_attribute("alt") and not browser.find_elements(By.XPATH, "//pre[contains(., '──►')]")
    finally:
        server.shutdown()


def test_the_pipeline_picture_is_drawn_the_same_from_its_source():
    """docs/pipeline_diagram.py: the same SVG bytes for the same data (a rebuilt site changes nothing),
    every stage's name in it as text, and every arrow between boxes it names."""
    sys.path.insert(0, str(REPO / "docs"))
    import pipeline_diagram
    svg = pipeline_diagram.render_svg()
    assert svg == pipeline_diagram.render_svg() and svg.startswith("<?xml")
    keys = {k for k, *_ in pipeline_diagram.BOXES}
    assert all(a in keys and b in keys for a, b, *_ in pipeline_diagram.ARROWS)
    for stage in ("probe", "select", "train", "vLLM job", "evaluate", "pass@k"):
        assert f">{stage}" in svg, stage


def test_every_config_field_says_what_it_is():
    """The Reference's help column (and `tbhpc fields`) is the comment on each field's line: a new
    field (or policy option) without one fails here; every config kind has its Reference section."""
    sys.path.insert(0, str(REPO / "docs"))
    import reference

    from tbhpc.cli.fields import policy_rows
    from tbhpc.fielddoc import KINDS, config_class, field_comments
    assert [kind for _, kind, _ in reference.CONFIGS] == list(KINDS)
    for kind in KINDS:
        cls = config_class(kind)
        helps = field_comments(cls)
        assert [f.name for f in dataclasses.fields(cls) if not helps.get(f.name)] == [], kind
    from tbhpc.policy import POLICY_NAMES
    for policy in POLICY_NAMES:                  # policy_opts too: every option the Reference lists says what it is
        assert [option for option, _, _, help in policy_rows(policy) if not help] == [], policy
    assert {o for o, *_ in policy_rows("tokens")} >= {"endpoint", "model_path", "generator", "temperature"}
