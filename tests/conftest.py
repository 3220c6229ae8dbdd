"""Shared fixtures: the bundled pack (loaded once) and a local OpenAI-compatible stub server.

The stub server is a *fake LLM* (a real HTTP server on a real loopback socket that answers from
a script): it exists because no LLM endpoint is available to unit tests. It exercises the real
client, retries and error paths; real-model serving is tested where a model server runs.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tbhpc.tasks.loader import load_pack

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def pack_tasks():
    return load_pack()


@pytest.fixture(scope="session")
def tasks_by_id(pack_tasks):
    return {t.id: t for t in pack_tasks}


class StubLLM:
    """Answers POST /v1/chat/completions with `responder(request_body) -> (status, content)`."""

    def __init__(self, responder):
        self.responder = responder
        self.requests: list[dict] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.requests.append(body)
                status, payload = stub.responder(body)
                if isinstance(payload, str):
                    payload = {"choices": [{"message": {"role": "assistant", "content": payload}}],
                               "usage": {"prompt_tokens": 11, "completion_tokens": 3}}
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stub_llm():
    servers = []

    def make(responder):
        s = StubLLM(responder)
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.close()


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """A tiny Qwen3-architecture model with the project's trained tokenizer (random weights)."""
    from tbhpc.policy.tiny import build_tiny_model
    return build_tiny_model(tmp_path_factory.mktemp("tiny-qwen3"), arch="qwen3")


@pytest.fixture(scope="session")
def tiny_dir_b(tmp_path_factory):
    """The same architecture and tokenizer with other weights: what a weight sync publishes."""
    from tbhpc.policy.tiny import build_tiny_model
    return build_tiny_model(tmp_path_factory.mktemp("tiny-qwen3-b"), arch="qwen3", seed=1)


@pytest.fixture(scope="session")
def warm_dir(tmp_path_factory):
    """The tiny model fine-tuned on oracle episodes of the smoke pool (`make warmstart`): it solves
    some tasks sometimes, so GRPO groups are mixed."""
    built = REPO / "build" / "models" / "tiny-warm"
    if (built / "config.json").exists():
        return built
    out = tmp_path_factory.mktemp("warm") / "tiny-warm"
    subprocess.run([sys.executable, "-m", "tbhpc.cli", "warmstart", "--out", str(out), "--tasks", "jobs/pools/smoke.yaml",
                    "--steps", "100"], cwd=REPO, check=True, capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return out


# `make test` runs `pytest -n 2 --dist loadgroup`. Every test file is a group of its own, so its
# module fixtures (a vLLM server, the shrunken demo) start once; the files whose tests read the
# local Slurm cluster's queue (fair share, preemption, requeue, the 3-node training job, the probe in
# a container) share one group and run one after another on one worker, so their jobs never compete
# for its slots.
# tryfirst: the marks must exist before xdist's own hook turns them into scheduling groups.
CLUSTER_FILES = {"test_slurm.py", "test_slurm_submitit.py", "test_make_train.py", "test_train_run.py", "test_container.py"}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        name = item.path.name
        item.add_marker(pytest.mark.xdist_group("cluster" if name in CLUSTER_FILES else name))


def pytest_configure(config):
    if not hasattr(config, "workerinput") and "TBHPC_MACHINE_NOTES" not in os.environ:   # the controller
        import tempfile
        fd, path = tempfile.mkstemp(prefix="tbhpc-notes-", suffix=".txt")
        os.close(fd)
        os.environ["TBHPC_MACHINE_NOTES"] = path


def pytest_unconfigure(config):
    if not hasattr(config, "workerinput"):
        Path(os.environ.get("TBHPC_MACHINE_NOTES", "/nonexistent")).unlink(missing_ok=True)


def pytest_terminal_summary(terminalreporter):
    """Printed at the end of every run (even with -q): the CPU class, and what tests that depend
    on it recorded (the vLLM kernel paths), so a log from another machine says which one it was."""
    from helpers import MACHINE_NOTES, cpu_class
    terminalreporter.write_line(f"machine: {cpu_class()}")
    path = Path(os.environ.get("TBHPC_MACHINE_NOTES", "/nonexistent"))
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else list(MACHINE_NOTES)
    for note in dict.fromkeys(lines):
        terminalreporter.write_line(f"machine: {note}")


# Headless Debian Chromium for the tests that open pages (the failure browser, the docs site).
CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")


@pytest.fixture(scope="module")
def browser():
    if not (CHROMIUM and DRIVER):
        if os.environ.get("TBHPC_REQUIRE_BROWSER"):
            pytest.fail("TBHPC_REQUIRE_BROWSER is set but chromium/chromedriver are missing (env/setup-browser.sh)")
        pytest.skip("no chromium + chromedriver (bash env/setup-browser.sh)")
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})     # console messages, for pages that must have none
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        opts.add_argument(arg)
    drv = webdriver.Chrome(service=Service(DRIVER), options=opts)
    yield drv
    drv.quit()


# TBHPC_CPU_PROFILE=FILE: one JSON line per test with the CPU seconds it cost (this worker's and the
# children it waited for: subprocesses, servers a fixture stopped), to find where the suite's time
# goes (docs/measurements/cpu-classes.md). Jobs Slurm runs are slurmd's children, not counted.
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    path = os.environ.get("TBHPC_CPU_PROFILE")
    if not path:
        yield
        return
    import json
    import resource
    import time

    def cpu() -> float:
        own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime
    c0, t0 = cpu(), time.monotonic()
    yield
    with open(path, "a") as f:
        f.write(json.dumps({"test": item.nodeid, "cpu_s": round(cpu() - c0, 2), "wall_s": round(time.monotonic() - t0, 2)}) + "\n")
