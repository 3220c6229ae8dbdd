#!/usr/bin/env bash
# The wheels `bash bench/gpu_check.sh` (its default parts) needs on a GPU machine that has CUDA torch and
# transformers but nothing else of tbhpc's (the device machines lent to sessions): DeepSpeed (no wheel on
# PyPI: built here from its sdist, pure Python, ops compiled on the GPU machine when first used), its
# dependencies, h5py (the rollout buffer) and pytest (the `tests` part). Versions are the ones installed
# in .venv (so the check runs what the suite ran); binary wheels for CPython 3.12 (the image's Python).
# Writes them to .whl/ (git-ignored through .git/info/exclude); ~12 MB, under the 64 MiB a call carries.
#
#   bash bench/gpu_wheels.sh            # then, on the GPU machine, from the repository root:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && \
#     TBHPC_PY=python3 PYTHONPATH=/tmp/site bash bench/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${TBHPC_PY:-.venv/bin/python}
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
rm -rf .whl && mkdir -p .whl
pins=$("$PY" - <<'PY'
from importlib.metadata import version
names = ["hjson", "pydantic", "pydantic-core", "annotated-types", "typing-inspection", "typing-extensions", "einops",
         "msgpack", "psutil", "py-cpuinfo", "ninja", "h5py", "pytest", "pluggy", "iniconfig"]
print(" ".join(f"{n}=={version(n)}" for n in names))
PY
)
DS=$("$PY" -c "import tomllib; print(next(d for d in tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['train'] if d.startswith('deepspeed')))")
"$PY" -m pip wheel -q --no-deps --no-build-isolation "$DS" -w .whl
# shellcheck disable=SC2086
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl $pins
ls .whl
du -sh .whl
