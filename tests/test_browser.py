"""The report's failure browser in a real headless browser (Debian's Chromium, driven through
chromedriver): open the report, follow its link to the task list, sort it, open a task, read an
attempt's transcript and diff side by side with the comparison run, and take screenshots.

`make test` installs Chromium (env/setup-browser.sh) and sets TBHPC_REQUIRE_BROWSER, so this
fails, never skips, in CI."""
import os
import shutil
import subprocess
import sys
from pathlib import Path


from tbhpc.campaign.config import CampaignConfig
from tbhpc.campaign.runner import run_campaign

def test_the_failure_browser_sorts_opens_a_task_and_shows_transcripts_side_by_side(tmp_path, browser):
    from selenium.webdriver.common.by import By
    weak, strong = tmp_path / "weak", tmp_path / "strong"
    run_campaign(CampaignConfig(name="weak", split="eval", limit=8, repeats=3, policy_opts={"skill": 0.5}), weak)
    run_campaign(CampaignConfig(name="strong", split="eval", limit=8, repeats=3, policy_opts={"skill": 0.95}), strong)
    out = tmp_path / "report"
    rep = subprocess.run([sys.executable, "-m", "tbhpc.cli", "report", str(weak), "--vs", str(strong), "--out", str(out),
                          "--bootstrap", "0"], capture_output=True, text=True, timeout=300)
    assert rep.returncode == 0, rep.stderr
    browser.get((out / "report.html").as_uri())
    browser.find_element(By.LINK_TEXT, "Failure browser").click()
    assert browser.current_url.endswith("failures.html")
    rows = browser.find_elements(By.CSS_SELECTOR, "#tasks tbody tr")
    assert len(rows) == 8
    rates = [float(r.find_elements(By.TAG_NAME, "td")[3].get_attribute("data-v")) for r in rows]
    assert rates == sorted(rates)                                     # opened sorted by pass rate, lowest first
    header = browser.find_elements(By.CSS_SELECTOR, "#tasks th")[3]
    header.click()                                                   # click: the other direction
    rates_desc = [float(r.find_elements(By.TAG_NAME, "td")[3].get_attribute("data-v"))
                  for r in browser.find_elements(By.CSS_SELECTOR, "#tasks tbody tr")]
    assert rates_desc == sorted(rates, reverse=True)
    browser.save_screenshot(str(tmp_path / "tasks.png"))
    worst = browser.find_elements(By.CSS_SELECTOR, "#tasks tbody tr")[-1]
    task_id = worst.find_element(By.TAG_NAME, "a").text
    worst.find_element(By.TAG_NAME, "a").click()
    assert browser.find_element(By.TAG_NAME, "h1").text == task_id
    columns = browser.find_elements(By.CSS_SELECTOR, ".cols .col h2")
    assert [c.text for c in columns] == ["weak (weak)", "strong (strong)"]    # base and comparison side by side
    failed = browser.find_elements(By.CSS_SELECTOR, "details[open] summary.fail")
    assert failed, "the worst task's failed attempts are open"
    page = browser.find_element(By.TAG_NAME, "body").text
    assert "state diff against the golden state" in page and "user\n" in page.lower()
    browser.save_screenshot(str(tmp_path / "task.png"))
    for png in ("tasks.png", "task.png"):
        assert (tmp_path / png).stat().st_size > 10_000
    shutil.copy(tmp_path / "task.png", Path(os.environ.get("TBHPC_SCREENSHOTS", tmp_path)) / "failure-browser-task.png") \
        if os.environ.get("TBHPC_SCREENSHOTS") else None
