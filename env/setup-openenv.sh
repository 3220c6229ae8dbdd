#!/usr/bin/env bash
# Create the OpenEnv serving environment .venv-openenv (used by `make env-openenv`, hence by
# `make test`): tbhpc with the `openenv-server` extra, for `tbhpc openenv-serve`. It never shares
# .venv: openenv 0.10 needs fastmcp 3, which pins the MCP SDK below 2.0, and the `mcp` extra
# tbhpc's tool-server path uses is 2.x. No torch: the server runs backends, users and graders,
# never a model. Versions come from pyproject.toml only.
set -euo pipefail
PY=${PY:-python3}
VENV=${VENV:-.venv-openenv}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --no-compile --upgrade pip
"$VENV/bin/python" -m pip install -q --no-compile -c env/locks/openenv.txt -e ".[openenv-server]"   # every version from `make lock`
"$VENV/bin/python" -c "import importlib.metadata as m, tbhpc.openenv.server; print('tbhpc OpenEnv env ready: openenv', m.version('openenv'), 'mcp', m.version('mcp'))"
