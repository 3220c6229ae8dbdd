"""A ThinkingBox-shaped checkout, built by the tests (never fetched), with the release's traps.

`build_checkout(root)` writes what a `thinkingbox-data` checkout holds, in miniature:
- `dataset/scenario/shop_support.yaml` and release-style test files under
  `dataset/test_case/shop_support/` whose module helpers `validate_database` /
  `validate_rubrics_yesno` have the reference's shape (written here in our own words), one of
  them with yes/no rubrics that carry no keywords;
- `dataset/test_case/tau_port.py`: a file outside the benchmark whose bodies are plain asserts;
- `releases/shop_v1/testlist.yaml`: the release's test list;
- `servers/shop_servers/`: an MCP server package with the two traps of the real one: its
  framework `fixmcp` is unpinned and its newest major (4.0) removed the module the server
  imports, and its seed table is package data the build does not declare (a plain install
  ships no `initial_data/`; an editable one reads the source folder). The package builds with
  an in-tree, standard-library PEP 517/660 backend, and `fixmcp` 3.0 and 4.0 are wheels in
  `wheels/`, so `pip install --no-index --find-links wheels/ ...` works with no network;
- `servers/servers.yaml`, as the real checkout's (`{python}` commands).
"""
from __future__ import annotations

import importlib.util
import json
import textwrap
from pathlib import Path

import yaml

SERVER = "shop"
SCENARIO = {
    "world_state": {SERVER: {"sources": [{"name": "cancellations.md", "snippets": ["Only pending orders can be cancelled."]}],
                             "data_patch": None, "golden_test_case": None}},
    "tools": [{"name": "get_order"}, {"name": "cancel_order"}],
    "bot_instructions": "You are the shop's support agent. Today is 2025-10-01.",
}

DATABASE_HELPER = '''
def validate_database(x: TestContext):
    mine = x.effects[SERVER_NAME]["result_db_hash"]
    wanted = x.effects[SERVER_NAME]["golden_db_hash"]
    if mine != wanted:
        problems = x.effects[SERVER_NAME].get("diff", [])
        text = f"state {mine} is not the golden {wanted}"
        for n, p in enumerate(problems, 1):
            text += f"\\n{n}. {json.dumps(p)[:200]}"
        assert False, text
'''

RUBRIC_HELPER = '''
def validate_rubrics_yesno(x: TestContext, judge: Judge):
    questions = x.effects[SERVER_NAME].get("rubrics_yesno", [])
    for q in questions:
        assert judge.text_yesno(x.response, q), f"rubric failed: {q}"
'''

HEADER = '''import json

from thinkingbox.common import Judge, TestContext

"""!
scenario: shop_support
"""
SERVER_NAME = "shop"
'''


def test_function(name: str, order: str, calls: list[tuple[str, dict]], body: str = "validate_database(x)",
                  rubrics: list[str] | None = None) -> str:
    init = {SERVER: {"data_patch": {"shop_orders": [{"id": order, "status": "pending", "total": 20.0}]},
                     "golden_test_case": {"tool_interactions": [{"tool": t, "parameters": p} for t, p in calls]}}}
    if rubrics:
        init[SERVER]["rubrics_yesno"] = rubrics
    doc = yaml.safe_dump({"query": f"Please cancel my order {order}.",
                          "user_context": f"You are Ann. Your order is {order}.", "init": init}, sort_keys=False)
    return (f"\n\ndef {name}(x: TestContext, judge: Judge):\n    \"\"\"!\n" + textwrap.indent(doc, "    ")
            + '    """\n' + textwrap.indent(body, "    ") + "\n")


def group1(extra: str = "", helper: str = DATABASE_HELPER) -> str:
    cancel = [("get_order", {"order_id": "O7"}), ("cancel_order", {"order_id": "O7"})]
    return (HEADER + helper + test_function("test_cancel_001", "O7", cancel)
            + test_function("test_lookup_002", "O8", [("get_order", {"order_id": "O8"})]) + extra)


def rubric_file() -> str:
    calls = [("get_order", {"order_id": "O9"}), ("cancel_order", {"order_id": "O9"})]
    return (HEADER + DATABASE_HELPER + RUBRIC_HELPER
            + test_function("test_cancel_rubric_001", "O9", calls, "validate_database(x)\nvalidate_rubrics_yesno(x, judge)",
                            ["Does the message confirm that the order is cancelled?"]))


TAU_PORT = '''from thinkingbox.common import Judge, TestContext

"""!
scenario: shop_support
"""


def test_book(x: TestContext, judge: Judge):
    """!
    query: Book me a flight.
    """
    reservations = x.effects["airline"]["reservations"]
    assert len(reservations) == 1
'''

RELEASE = ["shop_support_group1.py:test_cancel_001", "shop_support_group1.py:test_lookup_002",
           "shop_support_group1_rubrics_yesno.py:test_cancel_rubric_001"]

# ---- the server package -------------------------------------------------------------------

BACKEND = '''"""A PEP 517/660 build backend in the standard library only (a test fixture): a wheel holds the
package's .py files and nothing else (what setuptools does with package data it was not told
about); an editable wheel is a .pth file naming the source folder (so the data files are there)."""
import base64
import hashlib
import zipfile
from pathlib import Path

NAME, VERSION, PACKAGE = "shop_servers", "0.1.0", "shop_servers"
REQUIRES = ["fixmcp"]          # unpinned, like the real package's framework


def write_wheel(directory, name, version, files, requires=()):
    dist = f"{name}-{version}.dist-info"
    files = dict(files)
    files[f"{dist}/METADATA"] = (f"Metadata-Version: 2.1\\nName: {name}\\nVersion: {version}\\n"
                                 + "".join(f"Requires-Dist: {r}\\n" for r in requires))
    files[f"{dist}/WHEEL"] = "Wheel-Version: 1.0\\nGenerator: tinybuild\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n"
    wheel, record = f"{name}-{version}-py3-none-any.whl", []
    with zipfile.ZipFile(Path(directory) / wheel, "w") as z:
        for arc, text in files.items():
            data = text.encode()
            z.writestr(arc, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{arc},sha256={digest},{len(data)}")
        z.writestr(f"{dist}/RECORD", "\\n".join(record + [f"{dist}/RECORD,,"]) + "\\n")
    return wheel


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    root = Path(__file__).resolve().parent.parent
    files = {str(p.relative_to(root)): p.read_text() for p in sorted((root / PACKAGE).rglob("*.py"))}
    return write_wheel(wheel_directory, NAME, VERSION, files, REQUIRES)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    root = Path(__file__).resolve().parent.parent
    return write_wheel(wheel_directory, NAME, VERSION, {f"__editable__.{NAME}.pth": f"{root}\\n"}, REQUIRES)
'''

FRAMEWORK = '''"""fixmcp: a minimal stdio MCP server loop (newline-delimited JSON-RPC), a test fixture."""
import json
import sys


def serve(name, tools):
    """tools: name -> (function(**arguments) -> text, description, input schema)."""
    for line in sys.stdin:
        if not line.strip():
            continue
        msg = json.loads(line)
        if "id" not in msg or "method" not in msg:
            continue                                   # a notification or a reply: nothing to answer
        method, params = msg["method"], msg.get("params") or {}
        if method == "initialize":
            result = {"protocolVersion": params.get("protocolVersion"), "capabilities": {"tools": {}},
                      "serverInfo": {"name": name, "version": "1"}}
        elif method == "ping":
            result = {}
        elif method == "tools/list":
            result = {"tools": [{"name": n, "description": d, "inputSchema": s} for n, (f, d, s) in tools.items()]}
        elif method == "tools/call" and params.get("name") in tools:
            fn = tools[params["name"]][0]
            try:
                text = fn(**(params.get("arguments") or {}))
            except Exception as exc:                   # a tool error is a text result, as the reference servers do
                text = json.dumps({"error": str(exc), "tool": params["name"]})
            result = {"content": [{"type": "text", "text": text}], "isError": False}
        else:
            reply = {"jsonrpc": "2.0", "id": msg["id"], "error": {"code": -32601, "message": f"unknown {method}"}}
            sys.stdout.write(json.dumps(reply) + "\\n")
            sys.stdout.flush()
            continue
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}) + "\\n")
        sys.stdout.flush()
'''

SHOP_SERVER = '''"""The shop's tools and the reserved protocol over MCP (a test fixture shaped like the reference's
server packages: state in module globals, seed tables read from package data)."""
import copy
import hashlib
import json
from pathlib import Path

from fixmcp.server.tasks import serve

SEED = Path(__file__).parent / "initial_data" / "shop_orders.json"
STATE = {}


def seed():
    if not SEED.is_file():
        raise KeyError("Unknown table 'shop_orders'")
    return {"shop_orders": {r["id"]: r for r in json.loads(SEED.read_text())}}


def patched(config):
    db = seed()
    for table, rows in (config.get("data_patch") or {}).items():
        if table not in db:
            raise KeyError(f"Unknown table {table!r}")
        for row in rows:
            db[table][row["id"]] = {**db[table].get(row["id"], {}), **row}
    return db


def get_order(db, order_id):
    if order_id not in db["shop_orders"]:
        raise ValueError(f"no order {order_id}")
    return db["shop_orders"][order_id]


def cancel_order(db, order_id):
    order = get_order(db, order_id)
    if order["status"] != "pending":
        raise ValueError(f"order {order_id} is {order['status']}: only pending orders can be cancelled")
    order["status"] = "cancelled"
    return order


def digest(db):
    return hashlib.sha256(json.dumps(db, sort_keys=True).encode()).hexdigest()


def init(config):
    try:
        STATE.update(db=patched(config), config=copy.deepcopy(config))
    except KeyError as exc:
        return json.dumps({"error": str(exc).strip("\\"")})
    return "{}"


def effects():
    golden = patched(STATE["config"])
    for call in (STATE["config"].get("golden_test_case") or {}).get("tool_interactions") or []:
        try:
            TOOLS[call["tool"]](golden, **(call.get("parameters") or {}))
        except Exception:
            pass
    diff = [{"path": f"shop_orders.{k}", "result": STATE["db"]["shop_orders"].get(k), "golden": v}
            for k, v in golden["shop_orders"].items() if STATE["db"]["shop_orders"].get(k) != v]
    return json.dumps({"result_db_hash": digest(STATE["db"]), "golden_db_hash": digest(golden), "diff": diff,
                       "rubrics_yesno": STATE["config"].get("rubrics_yesno") or []})


TOOLS = {"get_order": get_order, "cancel_order": cancel_order}
ARG = {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}


def tool(fn):
    return lambda **kw: json.dumps(fn(STATE["db"], **kw))


if __name__ == "__main__":
    serve("shop", {
        "get_order": (tool(get_order), "Look up an order.", ARG),
        "cancel_order": (tool(cancel_order), "Cancel a pending order.", ARG),
        "__reserved__init": (init, "reset the state", {"type": "object", "properties": {"config": {"type": "object"}}}),
        "__reserved__geteffects": (effects, "state and golden hashes", {"type": "object", "properties": {}}),
        "__reserved__teardown": (lambda: "{}", "end", {"type": "object", "properties": {}}),
    })
'''

SEED_ROWS = [{"id": "O1", "status": "shipped", "total": 12.5}, {"id": "O2", "status": "pending", "total": 40.0}]


def build_server_package(root: Path) -> Path:
    pkg = root / "servers" / "shop_servers"
    (pkg / "_build").mkdir(parents=True)
    (pkg / "_build" / "tinybuild.py").write_text(BACKEND)
    (pkg / "pyproject.toml").write_text('[build-system]\nrequires = []\nbuild-backend = "tinybuild"\n'
                                        'backend-path = ["_build"]\n')
    (pkg / "shop_servers" / "initial_data").mkdir(parents=True)
    (pkg / "shop_servers" / "__init__.py").write_text("")
    (pkg / "shop_servers" / "mcp_shop.py").write_text(SHOP_SERVER)
    (pkg / "shop_servers" / "initial_data" / "shop_orders.json").write_text(json.dumps(SEED_ROWS))
    spec = importlib.util.spec_from_file_location("tinybuild_fixture", pkg / "_build" / "tinybuild.py")
    backend = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(backend)
    wheels = root / "wheels"
    wheels.mkdir()
    moved = FRAMEWORK.replace("a minimal stdio MCP server loop", "4.0: the server loop moved to fixmcp.server.run")
    backend.write_wheel(wheels, "fixmcp", "3.0", {"fixmcp/__init__.py": "", "fixmcp/server/__init__.py": "",
                                                  "fixmcp/server/tasks.py": FRAMEWORK})
    backend.write_wheel(wheels, "fixmcp", "4.0", {"fixmcp/__init__.py": "", "fixmcp/server/__init__.py": "",
                                                  "fixmcp/server/run.py": moved})
    return pkg


def build_checkout(root: Path, group1_text: str | None = None) -> Path:
    """The checkout at `root`; returns `root`."""
    (root / "dataset" / "scenario").mkdir(parents=True)
    (root / "dataset" / "scenario" / "shop_support.yaml").write_text(yaml.safe_dump(SCENARIO, sort_keys=False))
    folder = root / "dataset" / "test_case" / "shop_support"
    folder.mkdir(parents=True)
    (folder / "shop_support_group1.py").write_text(group1_text if group1_text is not None else group1())
    (folder / "shop_support_group1_rubrics_yesno.py").write_text(rubric_file())
    (root / "dataset" / "test_case" / "tau_port.py").write_text(TAU_PORT)
    (root / "releases" / "shop_v1").mkdir(parents=True)
    (root / "releases" / "shop_v1" / "testlist.yaml").write_text(yaml.safe_dump(RELEASE))
    build_server_package(root)
    (root / "servers" / "servers.yaml").write_text(yaml.safe_dump({"servers": {SERVER: {
        "type": "mcp-process", "command": ["{python}", "-m", "shop_servers.mcp_shop"], "env": {"TYPESENSE_API_KEY": "Fake"}}}}))
    return root
