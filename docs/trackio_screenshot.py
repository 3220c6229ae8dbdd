"""docs/trackio.png: trackio's dashboard on a real run, served locally, taken in headless Chromium.

    python docs/trackio_screenshot.py RUN [--project tbhpc] [--out docs/trackio.png]

RUN is a training run with trackio among its trackers (the guide's picture is a
`make train NODES=3` run with `trackers: [trackio, wandb]`). Nothing leaves the machine: the
dashboard is trackio's own server on 127.0.0.1, reading RUN/trackers/trackio.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(trackio_dir: Path, project: str, port: int) -> subprocess.Popen:
    code = (f"import trackio; trackio.show(project={project!r}, open_browser=False, block_thread=True, "
            f"host='127.0.0.1', server_port={port})")
    return subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "TRACKIO_DIR": str(trackio_dir)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def wait_up(url: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"trackio's dashboard did not answer at {url} in {timeout_s:g} s")


def shoot(url: str, out: Path, settle_s: float, metrics: str) -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium")
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,900",
                "--force-device-scale-factor=1"):
        opts.add_argument(arg)
    drv = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=opts)
    try:
        drv.get(url)
        time.sleep(settle_s)             # the plots draw after the page's scripts fetch the metrics
        if metrics:                      # the dashboard's own metric filter (a regex)
            box = drv.find_element(By.CSS_SELECTOR, "input[placeholder^='e.g., loss']")
            box.send_keys(metrics)
            time.sleep(settle_s)
        drv.save_screenshot(str(out))
    finally:
        drv.quit()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "trackio.png")
    ap.add_argument("--settle", type=float, default=8.0, help="seconds the page gets to draw")
    ap.add_argument("--metrics", default="reward_mean|loss$|grad_norm|policy_entropy|mixed_share|step_s",
                    help="the dashboard's metric filter (a regex; empty: every metric)")
    args = ap.parse_args()
    record = json.loads((args.run / "trackers" / "run.json").read_text())
    trackio_dir = Path(record["env"].get("TRACKIO_DIR", args.run / "trackers" / "trackio"))
    port = free_port()
    server = serve(trackio_dir, record["project"], port)
    try:
        url = f"http://127.0.0.1:{port}/"
        wait_up(url)
        shoot(f"{url}?project={record['project']}", args.out, args.settle, args.metrics)
    finally:
        server.terminate()
        server.wait(10)
    print(f"{args.out}: trackio's dashboard of {args.run} (project {record['project']})")


if __name__ == "__main__":
    main()
