#!/usr/bin/env bash
# Inside an image build (env/container/Dockerfile and tbhpc.def run this; nothing else does): the
# locked environments at /opt/tbhpc, exactly as `make env` installs them on a node (env/locks), so
# every node of every cluster runs the versions CI tested. Then `tbhpc doctor` checks the result:
# a package that differs from the lock fails the build.
#   TORCH_BUILD=cuda|cpu  the trainer's torch (default cuda)
#   VLLM_BUILD=cuda|cpu   the serving environment's vLLM (default: TORCH_BUILD; none: no .venv-vllm)
#   OPENENV=1             also .venv-openenv (OpenEnv servers)
set -euo pipefail
cd "$(dirname "$0")/../.."
[ "$PWD" = /opt/tbhpc ] || { echo "env/container/install.sh: for image builds only (the checkout at /opt/tbhpc); on a node: make env" >&2; exit 2; }
rm -rf .venv .venv-vllm .venv-openenv build runs     # a checkout's own environments, if the build copied them in
TORCH_BUILD=${TORCH_BUILD:-cuda}
VLLM_BUILD=${VLLM_BUILD:-$TORCH_BUILD}
if [ "$TORCH_BUILD" = cpu ] || [ "$VLLM_BUILD" = cpu ]; then     # torch 2.13.0+cpu is on PyTorch's index, not PyPI
  export PIP_EXTRA_INDEX_URL=${PIP_EXTRA_INDEX_URL:-https://download.pytorch.org/whl/cpu}
fi
export PIP_NO_CACHE_DIR=1
make env PY=python3 TORCH_BUILD="$TORCH_BUILD"
[ "$VLLM_BUILD" = none ] || make env-vllm PY=python3 VLLM_BUILD="$VLLM_BUILD"
[ "${OPENENV:-0}" != 1 ] || make env-openenv PY=python3
.venv/bin/tbhpc doctor | tee /dev/stderr | grep -q "packages      as locked" || {
  echo "env/container/install.sh: the environment differs from env/locks/trainer-$TORCH_BUILD.txt (above)" >&2; exit 1; }
