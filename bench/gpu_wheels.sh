#!/usr/bin/env bash
# The wheels `bash bench/gpu_check.sh memory` needs on a GPU machine that has CUDA torch and transformers
# but no DeepSpeed (the device machines lent to sessions): DeepSpeed (no wheel on PyPI: built here from
# its sdist, pure Python, ops compiled on the GPU machine when first used) and the dependencies that
# image lacks. Writes them to .whl/ (git-ignored through .git/info/exclude); versions from pyproject.toml.
#
#   bash bench/gpu_wheels.sh            # then, on the GPU machine, from the repository root:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && \
#     TBHPC_PY=python3 PYTHONPATH=/tmp/site:$PWD bash bench/gpu_check.sh memory
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${TBHPC_PY:-.venv/bin/python}
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
mkdir -p .whl
DS=$("$PY" -c "import tomllib; print(next(d for d in tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['train'] if d.startswith('deepspeed')))")
"$PY" -m pip wheel -q --no-deps --no-build-isolation "$DS" -w .whl
# the image's Python is 3.12 (the device tool's KINDS.md); pure-Python wheels need no platform
# (with their own dependencies, so pydantic-core is the version pydantic pins)
rm -f .whl/pydantic* .whl/annotated_types* .whl/typing_* .whl/hjson*
"$PY" -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
  hjson "pydantic>=2,<3"
ls -la .whl
du -sh .whl
