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
#
# Every version comes from the lock, env/locks/trainer-$TORCH_BUILD.txt (`make lock` makes it from
# pyproject.toml), given to pip as constraints: what is installed is what CI tested. TORCH_BUILD=cpu
# (this machine, CI, CPU nodes: torch 2.13.0+cpu, from the wheel on disk here or PyTorch's CPU index,
# PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu) or cuda (GPU nodes: PyPI's torch).
set -euo pipefail
PY=${PY:-python3}
VENV=${VENV:-.venv}
EXTRAS=${EXTRAS:-hf,test,mpi,gguf,train,bench,mcp,submitit,openenv,docs,tracking}
TORCH_BUILD=${TORCH_BUILD:-cpu}
LOCK=env/locks/trainer-$TORCH_BUILD.txt
[ -f "$LOCK" ] || { echo "env/setup.sh: no $LOCK (TORCH_BUILD must be cpu or cuda; \`make lock\` makes the locks)" >&2; exit 2; }
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --no-compile --upgrade pip
"$VENV/bin/python" -m pip install -q --no-compile -c "$LOCK" torch
"$VENV/bin/python" -m pip install -q --no-compile -c "$LOCK" -e ".[$EXTRAS]"
"$VENV/bin/python" -m pip install -q --no-compile --no-deps -c "$LOCK" $("$VENV/bin/python" -c "import tomllib; print(' '.join(tomllib.load(open('pyproject.toml', 'rb'))['tool']['tbhpc']['no-deps']))")
"$VENV/bin/python" -m compileall -q -j 0 "$VENV/lib" >/dev/null || true     # a file that does not compile (a py2 test fixture in a package) is not ours to fix
"$VENV/bin/python" -c "import tbhpc, torch, transformers, yaml; print('tbhpc env ready: torch', torch.__version__, 'transformers', transformers.__version__)"
