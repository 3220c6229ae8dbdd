#!/usr/bin/env bash
# Create the project environment in .venv from nothing (used by `make env`, hence by `make test`
# and `make demo`). Versions are pinned in pyproject.toml only.
#
# torch goes first, pinned to 2.13.0: on these machines that resolves to the CPU wheel on local
# disk; asking for any other torch spec (or letting transformers pull one in) can download a
# multi-GB CUDA build. On GPU clusters, install the CUDA torch you need before running this.
set -euo pipefail
PY=${PY:-python3}
VENV=${VENV:-.venv}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "torch==2.13.0"
"$VENV/bin/python" -m pip install -q -e '.[hf,test,mpi,gguf,train,bench,mcp,submitit]'
"$VENV/bin/python" -m pip install -q --no-deps $("$VENV/bin/python" -c "import tomllib; print(' '.join(tomllib.load(open('pyproject.toml', 'rb'))['tool']['tbhpc']['no-deps']))")
"$VENV/bin/python" -c "import tbhpc, torch, transformers, yaml; print('tbhpc env ready: torch', torch.__version__, 'transformers', transformers.__version__)"
