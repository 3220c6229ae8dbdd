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
    search:                               # optional: the policy-search backend the servers' `sources` need
      check: http://127.0.0.1:8108/health # any HTTP answer below 500 means it is up

When `search.check` does not answer, attempts run without policy search: `sources` is removed
from every server's init config, each worker says so once on stderr, and every such attempt is
recorded with `env_degraded = 'no_policy_search'` (so a report can tell them apart).

Why the same shape: a user points tbhpc at the servers file of their `thinkingbox-data`
checkout unchanged; tbhpc's own fields are optional additions.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from tbhpc.errors import PackError, UserError
from tbhpc.mcp.client import ServerSpec
from tbhpc.tasks.loader import read_yaml

_FIELDS = {"type", "command", "args", "env", "cwd", "reuse", "spare", "startup_timeout_s"}


@dataclass(frozen=True)
class ServersFile:
    servers: dict[str, ServerSpec]
    search_check: str | None = None


def load_servers(path: Path | str) -> ServersFile:
    path = Path(path).expanduser()
    if not path.is_file():
        raise UserError(f"{path}: servers file not found")
    doc = read_yaml(path)
    if not isinstance(doc, dict) or not isinstance(doc.get("servers"), dict):
        raise PackError(str(path), "expected a mapping with `servers: {NAME: {command: [...]}}`")
    python = str(doc.get("python") or sys.executable)
    search = doc.get("search") or {}
    if not isinstance(search, dict) or set(search) - {"check"} or not isinstance(search.get("check", ""), str):
        raise PackError(str(path), "expected {check: URL}", None, "search")
    return ServersFile({str(name): _spec(path, str(name), raw, python) for name, raw in doc["servers"].items()},
                       search.get("check"))


def search_answers(url: str, timeout_s: float = 3.0) -> bool:
    """Does the policy-search backend answer at all (any HTTP status below 500)?"""
    import urllib.error
    import urllib.request
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return resp.status < 500
    except urllib.error.HTTPError as exc:
        return exc.code < 500
    except (OSError, ValueError):
        return False


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
