#!/usr/bin/env bash
# Create the project environment in .venv from nothing (used by `make env`, hence by `make test`,
# and by `make env-demo`, hence `make demo`). Versions are pinned in pyproject.toml only.
#
# torch goes first, pinned to 2.13.0: on these machines that resolves to the CPU wheel on local
# disk; asking for any other torch spec (or letting transformers pull one in) can download a
# multi-GB CUDA build. On GPU clusters, install the CUDA torch you need before running this.
#
# EXTRAS: the pyproject extras to install (default: all of them; `make demo` asks for the ones it
# runs on). Bytecode: pip compiles each package on one core as it installs it (torch and
# transformers: ~25 s of a ~50 s install here); this installs without and compiles the whole
# environment once on every core at the end.
set -euo pipefail
PY=${PY:-python3}
VENV=${VENV:-.venv}
EXTRAS=${EXTRAS:-hf,test,mpi,gguf,train,bench,mcp,submitit,openenv,docs,tracking}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --no-compile --upgrade pip
"$VENV/bin/python" -m pip install -q --no-compile "torch==2.13.0"
"$VENV/bin/python" -m pip install -q --no-compile -e ".[$EXTRAS]"
"$VENV/bin/python" -m pip install -q --no-compile --no-deps $("$VENV/bin/python" -c "import tomllib; print(' '.join(tomllib.load(open('pyproject.toml', 'rb'))['tool']['tbhpc']['no-deps']))")
"$VENV/bin/python" -m compileall -q -j 0 "$VENV/lib" >/dev/null || true     # a file that does not compile (a py2 test fixture in a package) is not ours to fix
"$VENV/bin/python" -c "import tbhpc, torch, transformers, yaml; print('tbhpc env ready: torch', torch.__version__, 'transformers', transformers.__version__)"
