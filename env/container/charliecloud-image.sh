#!/usr/bin/env bash
# A directory image for charliecloud's ch-run: Debian bookworm (minbase) plus the shared libraries a
# Python environment bound in from the host needs (OpenSSL, SQLite, libgomp for torch, readline).
# Used by the container test on the local Slurm cluster (tests/test_container.py): the image is the
# operating system, the locked environment comes from the host at its own path. Images that carry
# the environment themselves: env/container/Dockerfile and tbhpc.def.
#   bash env/container/charliecloud-image.sh DIR     (make image-ch)
# Idempotent: DIR is built once (under DIR.building, then renamed), so an interrupted build leaves
# nothing half made at DIR. Installs ch-run and debootstrap from Debian when they are missing.
set -euo pipefail
dir=${1:?usage: charliecloud-image.sh DIR}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
libs=libssl3,libsqlite3-0,libgomp1,libreadline8,libncursesw6,libnsl2,libexpat1,libffi8,liblzma5,libbz2-1.0
if ! command -v ch-run >/dev/null 2>&1 || ! command -v debootstrap >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq --no-install-recommends charliecloud-runtime debootstrap >/dev/null 2>&1 || {
    apt-get update -qq && apt-get install -y -qq --no-install-recommends charliecloud-runtime debootstrap >/dev/null; }
fi
stamp="$dir/.tbhpc-image"
[ -f "$stamp" ] && [ "$(cat "$stamp")" = "bookworm minbase $libs" ] && exit 0
rm -rf "$dir.building" && mkdir -p "$(dirname "$dir")"
debootstrap --variant=minbase --include="$libs" bookworm "$dir.building" "$mirror" >"$dir.building.log" 2>&1 || {
  tail -5 "$dir.building.log" >&2; echo "charliecloud-image.sh: debootstrap failed (log: $dir.building.log)" >&2; exit 1; }
rm -rf "$dir.building/var/cache/apt/archives"/*.deb "$dir"
echo "bookworm minbase $libs" > "$dir.building/.tbhpc-image"
mv "$dir.building" "$dir" && rm -f "$dir.building.log"
echo "charliecloud-image.sh: $dir ($(du -sh "$dir" | cut -f1), ch-run $(USER=${USER:-$(id -un)} ch-run --version 2>&1))"
