"""The servers file: how to start each MCP tool server (the reference's `servers.yaml` shape).

    python: /opt/tb/.venv/bin/python      # optional: what "{python}" means (default: this interpreter)
    servers:
      sandbox_external_retail:
        type: mcp-process                 # the only type (stdio)
        command: ["{python}", "-m", "tb_business_ops_servers_202606.mcp_sandbox_external_retail"]
        env: {TYPESENSE_API_KEY: Fake}
        cwd: .                            # relative to this file
        reuse: false                      # true: __reserved__init resets it; keep the process for the next attempt
        spare: 1                          # processes started ahead per worker
        startup_timeout_s: 60

Why the same shape: a user points tbhpc at the servers file of their `thinkingbox-data`
checkout unchanged; tbhpc's own fields are optional additions.
"""
from __future__ import annotations

import sys
from pathlib import Path

from tbhpc.errors import PackError, UserError
from tbhpc.mcp.client import ServerSpec
from tbhpc.tasks.loader import read_yaml

_FIELDS = {"type", "command", "args", "env", "cwd", "reuse", "spare", "startup_timeout_s"}


def load_servers(path: Path | str) -> dict[str, ServerSpec]:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: servers file not found")
    doc = read_yaml(path)
    if not isinstance(doc, dict) or not isinstance(doc.get("servers"), dict):
        raise PackError(str(path), "expected a mapping with `servers: {NAME: {command: [...]}}`")
    python = str(doc.get("python") or sys.executable)
    return {str(name): _spec(path, str(name), raw, python) for name, raw in doc["servers"].items()}


def _spec(path: Path, name: str, raw, python: str) -> ServerSpec:
    where = f"servers.{name}"
    if not isinstance(raw, dict):
        raise PackError(str(path), "expected a mapping", None, where)
    bad = sorted(set(raw) - _FIELDS)
    if bad:
        raise PackError(str(path), f"unknown field(s) {', '.join(bad)}", None, f"{where}.{bad[0]}")
    if raw.get("type", "mcp-process") != "mcp-process":
        raise PackError(str(path), f"only mcp-process (stdio) servers are supported, got {raw['type']!r}", None, f"{where}.type")
    command = raw.get("command")
    if isinstance(command, str):
        command = [command]
    if not isinstance(command, list) or not command or not all(isinstance(c, str) for c in command):
        raise PackError(str(path), "expected a non-empty list of strings", None, f"{where}.command")
    args = raw.get("args") or []
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise PackError(str(path), "expected a list of strings", None, f"{where}.args")
    env = raw.get("env") or {}
    if not isinstance(env, dict):
        raise PackError(str(path), "expected a mapping", None, f"{where}.env")
    argv = [c.replace("{python}", python) for c in command + args]
    cwd = raw.get("cwd")
    spare = raw.get("spare", 1)
    if not isinstance(spare, int) or isinstance(spare, bool) or spare < 0:
        raise PackError(str(path), "must be a whole number >= 0", None, f"{where}.spare")
    timeout = raw.get("startup_timeout_s", 60)
    if not isinstance(timeout, (int, float)) or timeout <= 0:
        raise PackError(str(path), "must be a positive number of seconds", None, f"{where}.startup_timeout_s")
    return ServerSpec(name, argv[0], tuple(argv[1:]), {str(k): str(v) for k, v in env.items()},
                      str((path.parent / cwd).resolve()) if cwd else None, bool(raw.get("reuse", False)), spare,
                      float(timeout))
